//! What runs domaind without GPUs, NVLink or a cluster: `imex-sim`, a fake of
//! `nvidia-imex` and `nvidia-imex-ctl` that honours their files, signals, status query,
//! links and imports; and the loopback rack, real node daemons on 127.0.X.Y. Production
//! code reaches it only through the demo and bench commands (and `imex-sim` built into
//! `domaind` for them).

pub mod imex_sim;
pub mod rack;
