//! AFL++ target: see `domaind_fuzz::targets::pulse`.
fn main() {
    afl::fuzz(true, |data| {
        domaind_fuzz::targets::pulse(data);
    });
}
