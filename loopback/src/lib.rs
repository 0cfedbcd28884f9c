//! The one table of loopback subnets. Whatever binds real sockets on 127.0.X.Y (a test
//! that starts a rack, the demo, a bench) takes its third octet X from here, one entry
//! per user, so that no two of them can collide when they run side by side: test
//! binaries in parallel, tests of one binary on its threads, a bench beside the suite.
//! A new user adds an entry with an octet no other entry has (the test below checks).
//!
//! Octet 0 is not ours: 127.0.0.1 holds the shared Kubernetes control plane of
//! `../shared/kube` and 127.0.0.2 and up its fake nodes, each kubelet on fixed ports: the
//! end-to-end suite takes their last octets from [`kubelets`], the second table here.
//! Tests that bind only port 0 on 127.0.0.x (the gossip tests, unit tests on 127.0.0.1)
//! need no entry: an ephemeral port collides with nothing. Addresses that are only data
//! (never bound) need none either.

use std::net::Ipv4Addr;

/// The address `127.0.<subnet>.<host>`.
pub const fn addr(subnet: u8, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, subnet, host)
}

/// Defines each subnet's constant and lists them all in [`ALL`], so that the list
/// cannot miss one.
macro_rules! subnets {
    ($($(#[doc = $doc:literal])+ $name:ident = $octet:literal;)+) => {
        $($(#[doc = $doc])+ pub const $name: u8 = $octet;)+

        /// Every entry of the table: its name and octet.
        pub const ALL: &[(&str, u8)] = &[$((stringify!($name), $name)),+];
    };
}

subnets! {
    // Defaults of the binaries.
    /// `domaind demo`'s default `--subnet` (the README's rack on 127.0.77.x).
    DEMO = 77;
    /// `domaind-chaos run`'s default `--subnet` (chaos/src/cli.rs).
    CHAOS_RUN = 78;
    /// `domaind bench demo`'s default `--subnet`: the demo it runs, again and again.
    BENCH_DEMO = 79;
    /// `domaind bench prepare`'s default `--subnet`.
    BENCH_PREPARE = 145;
    /// deploy/image/check-rootfs.sh's daemon (127.0.101.1). A shell script: it cannot
    /// read this table, so keep the two in step.
    IMAGE_ROOTFS_CHECK = 101;

    // The daemon's process tests (daemon/tests/cli, one binary).
    /// daemon/tests/cli/demo.rs, `the_demo_forms_heals_and_rejoins_...`.
    CLI_DEMO = 141;
    /// daemon/tests/cli/demo.rs, `a_rack_of_cliques_forms_a_domain_per_clique_...`.
    CLI_DEMO_CLIQUES = 142;
    /// daemon/tests/cli/demo.rs, `two_domains_share_a_rack_...`.
    CLI_DEMO_DOMAINS = 174;
    /// daemon/tests/cli/bench.rs: `domaind bench prepare`, run tiny.
    CLI_BENCH_PREPARE = 49;
    /// daemon/tests/cli/imex_failing.rs.
    CLI_IMEX_FAILING = 144;
    /// daemon/tests/cli/imex_orphans.rs.
    CLI_IMEX_ORPHANS = 143;
    /// daemon/tests/cli/imex_tls.rs.
    CLI_IMEX_TLS = 57;
    /// daemon/tests/cli/imex_kill.rs.
    CLI_IMEX_KILL = 58;
    /// daemon/tests/cli/kubelet_sim.rs.
    CLI_KUBELET_SIM = 59;

    // The chaos harness's real runs (chaos/tests/real_run.rs).
    /// chaos/tests/real_run.rs, `three_nodes_under_seeded_faults_...`.
    CHAOS_REAL_RUN = 146;
    /// chaos/tests/real_run.rs, `a_full_state_directory_breaks_no_invariant`.
    CHAOS_REAL_RUN_FULL_DISK = 45;
    /// chaos/tests/real_run.rs, `sharing_domains_under_kills_pauses_and_domain_churn_...`.
    CHAOS_REAL_RUN_SHARING = 173;
    /// chaos/tests/real_run.rs, `a_soak_samples_every_daemon_and_passes_no_life_...`.
    CHAOS_REAL_RUN_SOAK = 183;

    // The end-to-end suite (tests/suite, one binary).
    /// tests/suite/rack.rs, `three_daemons_form_a_domain_heal_a_kill_and_rejoin`.
    E2E_RACK_FORMS = 41;
    /// tests/suite/rack.rs, `bad_claims_get_precise_errors_over_the_socket`.
    E2E_RACK_BAD_CLAIMS = 42;
    /// tests/suite/rack.rs, `a_claim_deleted_while_the_daemon_was_down_...`.
    E2E_RACK_DELETED_CLAIM = 43;
    /// tests/suite/rack.rs, `forged_gossip_leaves_a_formed_domain_ready_...` (its forger
    /// on .250).
    E2E_RACK_FORGED_GOSSIP = 44;
    /// tests/suite/rack.rs, `a_daemon_restart_leaves_imex_running_...`.
    E2E_RACK_IMEX_RUNNER = 50;
    /// tests/suite/kube.rs: `DOMAIND_E2E_IPS`' default (docs/TESTING.md).
    E2E_KUBE = 46;
    /// tests/suite/formation.rs: 18 daemons on a real API server.
    E2E_FORMATION = 47;
    /// tests/suite/statedir.rs.
    E2E_STATEDIR = 48;
    /// tests/suite/certs.rs: the daemon that gets its certificate through a CSR.
    E2E_CERTS = 121;
    /// tests/suite/discovery.rs: `DOMAIND_E2E_DISCOVERY_IPS`' default.
    E2E_DISCOVERY = 131;
    /// tests/suite/storm.rs.
    E2E_STORM = 147;
    /// tests/suite/cliques.rs.
    E2E_CLIQUES = 148;
    /// tests/suite/clique_move.rs.
    E2E_CLIQUE_MOVE = 181;
    /// tests/suite/scale.rs: up to 144 daemons (8 cliques of 18) on one real API server.
    E2E_SCALE = 182;

    // The node crate's tests.
    /// testbed/src/rack/mod.rs's unit tests: racks created (ports checked), never started.
    NODE_RACK_UNIT_TESTS = 135;
    /// testbed/tests/imex/sim.rs: `imex-sim` racks through the IMEX adapter.
    NODE_IMEX_SIM_TESTS = 151;
    /// testbed/tests/imex/tls.rs.
    NODE_IMEX_TLS_TESTS = 152;
    /// testbed/tests/imex/supervisor.rs.
    NODE_IMEX_SUPERVISOR_TESTS = 153;
    /// testbed/tests/imex/runner.rs.
    NODE_IMEX_RUNNER_TESTS = 154;
    /// testbed/tests/imex/host_service.rs.
    NODE_IMEX_HOST_SERVICE_TESTS = 155;
}

/// The end-to-end suite's fake nodes on `../shared/kube` (real kubelets on
/// 127.0.0.X, fixed ports each): the last octets of each test's nodes, none shared, so
/// that tests run side by side never start two kubelets on one address.
pub mod kubelets {
    macro_rules! hosts {
        ($($(#[doc = $doc:literal])+ $name:ident = [$($host:literal),+];)+) => {
            $($(#[doc = $doc])+ pub const $name: &[u8] = &[$($host),+];)+

            pub const ALL: &[(&str, &[u8])] = &[$((stringify!($name), $name)),+];
        };
    }

    hosts! {
        /// tests/suite/kubelet.rs: NVIDIA's blog workload.
        BLOG = [2, 3, 4];
        /// tests/suite/sharing.rs.
        SHARING = [5, 6, 7];
        /// tests/suite/chaos_cluster.rs.
        CHAOS_CLUSTER = [8, 9, 10];
        /// tests/suite/admin.rs.
        ADMIN = [11, 12];
        /// tests/suite/health.rs.
        HEALTH = [13, 14];
        /// tests/suite/pods.rs.
        PODS = [41, 42];
        /// tests/suite/taints.rs.
        TAINTS = [43, 44];
        /// tests/suite/claim_status.rs.
        CLAIM_STATUS = [51, 52];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_octet_is_used_twice_and_none_is_the_shared_clusters() {
        for (i, (name, octet)) in ALL.iter().enumerate() {
            assert_ne!(*octet, 0, "{name}: 127.0.0.x is the shared kube cluster's");
            if let Some((other, _)) = ALL[..i].iter().find(|(_, o)| o == octet) {
                panic!("{name} and {other} both use 127.0.{octet}.x");
            }
        }
    }

    #[test]
    fn no_kubelet_address_is_used_twice_and_none_is_the_control_planes() {
        let mut seen: Vec<(u8, &str)> = Vec::new();
        for (name, hosts) in kubelets::ALL {
            for host in *hosts {
                assert!(*host >= 2, "{name}: 127.0.0.{host} is the control plane's");
                if let Some((_, other)) = seen.iter().find(|(h, _)| h == host) {
                    panic!("{name} and {other} both start a kubelet on 127.0.0.{host}");
                }
                seen.push((*host, name));
            }
        }
    }

    #[test]
    fn addr_puts_the_subnet_third() {
        assert_eq!(addr(DEMO, 4), Ipv4Addr::new(127, 0, 77, 4));
    }
}
