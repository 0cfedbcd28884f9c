//! The node's machine adapters against real files, processes and sockets: the CDI
//! specs against the CNCF schema, the GPU inventory, and `imex-sim` with the IMEX
//! supervisor. One test binary: each costs link time and disk.

mod cdi_schema;
mod imex_host_service;
mod imex_runner;
mod imex_sim;
mod imex_supervisor;
mod imex_tls;
