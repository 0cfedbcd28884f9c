//! AFL++ target: see `domaind_fuzz::targets::frame`.
fn main() {
    afl::fuzz(true, |data| {
        domaind_fuzz::targets::frame(data);
    });
}
