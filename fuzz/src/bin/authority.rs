//! AFL++ target: see `domaind_fuzz::targets::authority`.
fn main() {
    afl::fuzz(true, |data| {
        domaind_fuzz::targets::authority(data);
    });
}
