//! AFL++ target: see `domaind_fuzz::targets::claim_params`.
fn main() {
    afl::fuzz(true, |data| {
        domaind_fuzz::targets::claim_params(data);
    });
}
