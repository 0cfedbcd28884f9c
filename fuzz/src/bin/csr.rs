//! AFL++ target: see `domaind_fuzz::targets::csr`.
fn main() {
    afl::fuzz(true, |data| {
        domaind_fuzz::targets::csr(data);
    });
}
