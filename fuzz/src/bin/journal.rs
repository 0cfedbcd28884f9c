//! AFL++ target: see `domaind_fuzz::targets::journal`.
fn main() {
    afl::fuzz(true, |data| {
        domaind_fuzz::targets::journal(data);
    });
}
