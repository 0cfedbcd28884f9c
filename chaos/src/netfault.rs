//! Network faults between a rack's loopback addresses, with iptables: a partition
//! (one node cut off from the others) and packet loss.
//!
//! Everything lives in one chain of our own, `DOMAIND-CHAOS-<subnet>`, entered from
//! INPUT only for packets whose source *and* destination are in the rack's
//! 127.0.<subnet>.0/24. Nothing outside that range is ever matched: not the machine's
//! other loopback traffic (the harness itself talks to the daemons from 127.0.0.1),
//! not another rack, not a real interface. Removing the chain and its one jump undoes
//! everything; it is done on exit, on Ctrl-C (the value is dropped), and at the next
//! start if a killed harness left it behind.
//!
//! Loss uses iptables' `statistic` match rather than `tc netem` on `lo`: a qdisc on
//! `lo` would also delay or drop every other loopback packet of the machine, and the
//! kernels we run on may not ship netem at all.

use std::net::Ipv4Addr;
use std::process::Command;

use anyhow::{Context as _, bail};

/// Network fault control for one rack subnet.
#[derive(Debug)]
pub struct NetFaults {
    iptables: String,
    chain: String,
    range: String,
    subnet: u8,
    installed: bool,
}

impl NetFaults {
    /// Checks that we are root and iptables works; the reason when not, for the report.
    pub fn probe(subnet: u8) -> Result<Self, String> {
        if !(1..=254).contains(&subnet) {
            return Err(format!(
                "subnet {subnet} would include 127.0.0.1 or the broadcast range; network faults need 1..=254"
            ));
        }
        if !nix::unistd::geteuid().is_root() {
            return Err("not root: partition and loss need iptables (run as root)".into());
        }
        let iptables = "iptables".to_owned();
        match Command::new(&iptables).args(["-w", "-S", "INPUT"]).output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                return Err(format!(
                    "iptables does not work here: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Err(error) => {
                return Err(format!(
                    "iptables is not installed ({error}); on Debian: apt-get install iptables"
                ));
            }
        }
        let mut faults = Self {
            iptables,
            chain: format!("DOMAIND-CHAOS-{subnet}"),
            range: format!("127.0.{subnet}.0/24"),
            subnet,
            installed: false,
        };
        // A harness killed with SIGKILL cannot clean up: its chain would cut this run.
        faults.remove();
        Ok(faults)
    }

    fn run(&self, args: &[&str]) -> anyhow::Result<()> {
        let out = Command::new(&self.iptables)
            .arg("-w")
            .args(args)
            .output()
            .with_context(|| format!("cannot run {}", self.iptables))?;
        if !out.status.success() {
            bail!(
                "iptables {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// The rule in INPUT that sends the rack's packets, and only those, to our chain.
    fn jump(&self) -> [&str; 6] {
        ["-s", &self.range, "-d", &self.range, "-j", &self.chain]
    }

    fn install(&mut self) -> anyhow::Result<()> {
        if self.installed {
            return Ok(());
        }
        self.run(&["-N", &self.chain])?;
        let jump = self.jump();
        let mut args = vec!["-I", "INPUT"];
        args.extend_from_slice(&jump);
        self.run(&args)?;
        self.installed = true;
        Ok(())
    }

    fn check_in_range(&self, ip: Ipv4Addr) -> anyhow::Result<()> {
        let [a, b, c, _] = ip.octets();
        if (a, b, c) != (127, 0, self.subnet) {
            bail!("{ip} is not in the rack's {}", self.range);
        }
        Ok(())
    }

    /// Cuts `node` off from every other address of the rack (both directions); its
    /// traffic with itself still flows.
    pub fn partition(&mut self, node: Ipv4Addr) -> anyhow::Result<()> {
        self.check_in_range(node)?;
        self.install()?;
        self.run(&["-F", &self.chain])?;
        let ip = node.to_string();
        self.run(&["-A", &self.chain, "-s", &ip, "-d", &ip, "-j", "RETURN"])?;
        self.run(&["-A", &self.chain, "-s", &ip, "-j", "DROP"])?;
        self.run(&["-A", &self.chain, "-d", &ip, "-j", "DROP"])?;
        Ok(())
    }

    /// Drops `percent` of the packets between the rack's addresses, at random.
    pub fn loss(&mut self, percent: u32) -> anyhow::Result<()> {
        if !(1..=100).contains(&percent) {
            bail!("loss of {percent}% makes no sense");
        }
        self.install()?;
        self.run(&["-F", &self.chain])?;
        let probability = format!("{:.4}", f64::from(percent) / 100.0);
        self.run(&[
            "-A",
            &self.chain,
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            &probability,
            "-j",
            "DROP",
        ])?;
        Ok(())
    }

    /// Ends the current fault: every packet flows again.
    pub fn heal(&mut self) -> anyhow::Result<()> {
        if self.installed {
            self.run(&["-F", &self.chain])?;
        }
        Ok(())
    }

    /// Removes the jump and the chain, whether or not this value installed them.
    /// Errors are ignored: each step may already be undone.
    pub fn remove(&mut self) {
        let jump = self.jump();
        let mut args = vec!["-D", "INPUT"];
        args.extend_from_slice(&jump);
        // A jump inserted twice (two runs killed in a row) is deleted twice; bounded.
        for _ in 0..8 {
            if self.run(&args).is_err() {
                break;
            }
        }
        let _ = self.run(&["-F", &self.chain]);
        let _ = self.run(&["-X", &self.chain]);
        self.installed = false;
    }

    /// Whether our chain exists (for tests and for the final report).
    pub fn chain_present(&self) -> bool {
        self.run(&["-S", &self.chain]).is_ok()
    }

    pub fn chain(&self) -> &str {
        &self.chain
    }
}

impl Drop for NetFaults {
    fn drop(&mut self) {
        self.remove();
    }
}
