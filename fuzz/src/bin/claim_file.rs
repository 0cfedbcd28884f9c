//! AFL++ target: see `domaind_fuzz::targets::claim_file`.
fn main() {
    afl::fuzz(true, |data| {
        domaind_fuzz::targets::claim_file(data);
    });
}
