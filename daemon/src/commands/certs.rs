//! `domaind certs`: a development CA and node certificates.

use anyhow::Context;
use domaind_gossip::pki::{DevCa, NodeCertRequest};
use time::Duration;

use crate::cli::CertsCommand;

pub fn run(command: CertsCommand) -> anyhow::Result<()> {
    match command {
        CertsCommand::Init {
            out,
            name,
            valid_days,
        } => {
            let ca = DevCa::generate(&name, Duration::days(valid_days.into()))?;
            ca.write(&out)?;
            println!(
                "CA written to {} (ca.crt, ca.key). Keep ca.key private.",
                out.display()
            );
            Ok(())
        }
        CertsCommand::Issue {
            ca,
            node,
            out,
            ips,
            imex_shared_name,
            valid_days,
        } => {
            let ca = DevCa::load(&ca).with_context(|| {
                format!(
                    "cannot use the CA in {} (make one with `domaind certs init --out {}`)",
                    ca.display(),
                    ca.display()
                )
            })?;
            let mut request = NodeCertRequest::new(node.clone(), Duration::days(valid_days.into()));
            request.ips = ips;
            request.imex_shared_name = imex_shared_name;
            let paths = ca.issue(&request)?.write(&out)?;
            println!(
                "certificate for node {node} written to {} ({}, {}, {})",
                out.display(),
                paths.cert.display(),
                paths.key.display(),
                paths.ca_cert.display()
            );
            Ok(())
        }
    }
}
