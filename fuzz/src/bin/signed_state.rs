//! AFL++ target: see `domaind_fuzz::targets::signed_state`.
fn main() {
    afl::fuzz(true, |data| {
        domaind_fuzz::targets::signed_state(data);
    });
}
