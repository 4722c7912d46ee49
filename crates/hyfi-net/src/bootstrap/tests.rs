//! The rules of [`detect`](super::detect), one launcher at a time, over
//! made-up environments.

use super::token::fallback_random;
use super::*;

fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |k| {
        vars.iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| v.to_string())
    }
}

fn member(vars: &[(&str, &str)]) -> JobSpec {
    match detect(env(vars)) {
        Ok(Detected::Member(spec)) => spec,
        other => panic!("expected a member, got {other:?}"),
    }
}

fn error(vars: &[(&str, &str)]) -> String {
    match detect(env(vars)) {
        Err(e) => e.to_string(),
        Ok(d) => panic!("expected an error, got {d:?}"),
    }
}

const TOKEN_HEX: &str = "000102030405060708090a0b0c0d0e0f";
const TOKEN: Token = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

#[test]
fn nothing_set_is_single() {
    assert_eq!(detect(env(&[])).unwrap(), Detected::Single);
    assert_eq!(
        detect(env(&[("HYFI_NODES", "1")])).unwrap(),
        Detected::Single
    );
    assert_eq!(
        detect(env(&[("HYFI_NODES", "")])).unwrap(),
        Detected::Single
    );
}

#[test]
fn hyfi_nodes_alone_launches_locally() {
    assert_eq!(
        detect(env(&[("HYFI_NODES", "4")])).unwrap(),
        Detected::LaunchLocal { nodes: 4 }
    );
}

#[test]
fn hyfi_nodes_bad_values() {
    for bad in ["0", "four", "-2", "2.5"] {
        let e = error(&[("HYFI_NODES", bad)]);
        assert!(e.contains(&format!("HYFI_NODES={bad:?}")), "{e}");
        assert!(e.contains("whole number >= 1"), "{e}");
    }
}

#[test]
fn hyfi_member_with_coord_job_and_token() {
    let spec = member(&[
        ("HYFI_RANK", "2"),
        ("HYFI_NODES", "4"),
        ("HYFI_COORD", "127.0.0.1:40000"),
        ("HYFI_JOB", "12345"),
        ("HYFI_TOKEN", TOKEN_HEX),
    ]);
    assert_eq!(
        spec,
        JobSpec {
            rank: 2,
            nodes: 4,
            rendezvous: Rendezvous::Coord("127.0.0.1:40000".into()),
            job: 12345,
            token: Some(TOKEN),
            launcher: Launcher::Hyfi,
        }
    );
}

#[test]
fn hyfi_member_with_file_and_derived_job() {
    let vars = [
        ("HYFI_RANK", "0"),
        ("HYFI_NODES", "1"),
        ("HYFI_RENDEZVOUS", "/shared/job.addr"),
    ];
    let spec = member(&vars);
    assert_eq!(spec.rendezvous, Rendezvous::File("/shared/job.addr".into()));
    assert_eq!(spec.job, fnv1a(b"/shared/job.addr"));
    assert_eq!(spec.token, None);
    // Every node derives the same job id.
    assert_eq!(member(&vars).job, spec.job);
}

#[test]
fn hyfi_coord_wins_over_file() {
    let spec = member(&[
        ("HYFI_RANK", "0"),
        ("HYFI_NODES", "2"),
        ("HYFI_RENDEZVOUS", "/shared/job.addr"),
        ("HYFI_COORD", "n0:7777"),
    ]);
    assert_eq!(spec.rendezvous, Rendezvous::Coord("n0:7777".into()));
}

#[test]
fn hyfi_bad_values() {
    let e = error(&[
        ("HYFI_RANK", "x"),
        ("HYFI_NODES", "2"),
        ("HYFI_COORD", "h:1"),
    ]);
    assert!(
        e.contains("HYFI_RANK=\"x\"") && e.contains("whole number >= 0"),
        "{e}"
    );
    let e = error(&[
        ("HYFI_RANK", "2"),
        ("HYFI_NODES", "2"),
        ("HYFI_COORD", "h:1"),
    ]);
    assert!(
        e.contains("HYFI_RANK=\"2\"") && e.contains("below HYFI_NODES"),
        "{e}"
    );
    let e = error(&[("HYFI_RANK", "0"), ("HYFI_COORD", "h:1")]);
    assert!(
        e.contains("HYFI_NODES") && e.contains("whenever HYFI_RANK is set"),
        "{e}"
    );
    let e = error(&[
        ("HYFI_RANK", "0"),
        ("HYFI_NODES", "0"),
        ("HYFI_COORD", "h:1"),
    ]);
    assert!(e.contains("HYFI_NODES=\"0\""), "{e}");
    for coord in ["nohost", "h:", ":80", "h:99999", "h:0", "h h:80", "h:8o"] {
        let e = error(&[
            ("HYFI_RANK", "0"),
            ("HYFI_NODES", "2"),
            ("HYFI_COORD", coord),
        ]);
        assert!(e.contains("HYFI_COORD") && e.contains("host:port"), "{e}");
    }
    let e = error(&[
        ("HYFI_RANK", "0"),
        ("HYFI_NODES", "2"),
        ("HYFI_COORD", "h:1"),
        ("HYFI_JOB", "abc"),
    ]);
    assert!(
        e.contains("HYFI_JOB=\"abc\"") && e.contains("decimal"),
        "{e}"
    );
    for token in [
        "abc",
        "000102030405060708090a0b0c0d0e0g",
        "000102030405060708090a0b0c0d0e0f00",
    ] {
        let e = error(&[
            ("HYFI_RANK", "0"),
            ("HYFI_NODES", "2"),
            ("HYFI_COORD", "h:1"),
            ("HYFI_TOKEN", token),
        ]);
        assert!(
            e.contains("HYFI_TOKEN") && e.contains("32 hexadecimal digits"),
            "{e}"
        );
    }
}

#[test]
fn bad_coord_or_token_is_an_error_whatever_the_launcher() {
    // A one-node run, the embedded launcher, Slurm: a malformed value is
    // reported, never ignored.
    for base in [
        vec![],
        vec![("HYFI_NODES", "3")],
        vec![("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")],
    ] {
        let mut vars = base.clone();
        vars.push(("HYFI_COORD", "node0"));
        let e = error(&vars);
        assert!(
            e.contains("HYFI_COORD=\"node0\"") && e.contains("host:port"),
            "{e}"
        );
        let mut vars = base.clone();
        vars.push(("HYFI_TOKEN", "secret"));
        let e = error(&vars);
        assert!(
            e.contains("HYFI_TOKEN=\"secret\"") && e.contains("openssl rand -hex 16"),
            "{e}"
        );
    }
}

#[test]
fn hyfi_rank_without_rendezvous() {
    let e = error(&[("HYFI_RANK", "1"), ("HYFI_NODES", "2")]);
    assert!(
        e.contains("hyfi started this process as node 1 of 2"),
        "{e}"
    );
    assert!(e.contains("HYFI_COORD=host:port"), "{e}");
}

#[test]
fn hyfi_wins_over_launchers() {
    let spec = member(&[
        ("HYFI_RANK", "1"),
        ("HYFI_NODES", "2"),
        ("HYFI_COORD", "h:1"),
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "8"),
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "6"),
    ]);
    assert_eq!(
        (spec.rank, spec.nodes, spec.launcher),
        (1, 2, Launcher::Hyfi)
    );
}

#[test]
fn ompi_all_local_uses_a_temp_file() {
    let spec = member(&[
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ("PMIX_NAMESPACE", "prterun-host-1234@1"),
        ("OMPI_MCA_ess_base_jobid", "999"),
        ("TMPDIR", "/scratch/tmp"),
    ]);
    assert_eq!(
        spec,
        JobSpec {
            rank: 1,
            nodes: 4,
            rendezvous: Rendezvous::File(
                private_dir("/scratch/tmp".as_ref()).join("hyfi-prterun-host-1234_1.addr")
            ),
            job: fnv1a(b"prterun-host-1234_1"),
            token: None,
            launcher: Launcher::OpenMpi,
        }
    );
}

#[test]
fn ompi_jobid_fallback_and_default_tmp() {
    let spec = member(&[
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("OMPI_MCA_ess_base_jobid", "3735879681"),
    ]);
    assert_eq!(
        spec.rendezvous,
        Rendezvous::File(private_dir("/tmp".as_ref()).join("hyfi-3735879681.addr"))
    );
    assert_eq!(spec.job, fnv1a(b"3735879681"));
}

#[test]
fn ompi_explicit_rendezvous_and_overrides() {
    let spec = member(&[
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "8"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ("PMIX_NAMESPACE", "ns"),
        ("HYFI_COORD", "node0:7777"),
        ("HYFI_JOB", "77"),
        ("HYFI_TOKEN", TOKEN_HEX),
    ]);
    assert_eq!(spec.rendezvous, Rendezvous::Coord("node0:7777".into()));
    assert_eq!((spec.job, spec.token), (77, Some(TOKEN)));
    let spec = member(&[
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "8"),
        ("HYFI_RENDEZVOUS", "/home/me/job.addr"),
    ]);
    assert_eq!(
        spec.rendezvous,
        Rendezvous::File("/home/me/job.addr".into())
    );
    assert_eq!(spec.job, fnv1a(b"/home/me/job.addr"));
}

#[test]
fn ompi_across_hosts_needs_a_rendezvous() {
    let e = error(&[
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "8"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ("PMIX_NAMESPACE", "ns"),
    ]);
    assert!(
        e.contains("Open MPI (mpirun) started this process as node 3 of 8"),
        "{e}"
    );
    assert!(e.contains("mpirun -x HYFI_COORD=node0:7777"), "{e}");
    // All local but no job key: no safe file name either.
    let e = error(&[
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
    ]);
    assert!(e.contains("HYFI_RENDEZVOUS=/shared/path"), "{e}");
}

#[test]
fn ompi_bad_values() {
    let e = error(&[("OMPI_COMM_WORLD_RANK", "0")]);
    assert!(
        e.contains("OMPI_COMM_WORLD_SIZE") && e.contains("together with the rank"),
        "{e}"
    );
    let e = error(&[("OMPI_COMM_WORLD_RANK", "8"), ("OMPI_COMM_WORLD_SIZE", "8")]);
    assert!(
        e.contains("OMPI_COMM_WORLD_RANK=\"8\"") && e.contains("below OMPI_COMM_WORLD_SIZE"),
        "{e}"
    );
    let e = error(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "0")]);
    assert!(e.contains("OMPI_COMM_WORLD_SIZE=\"0\""), "{e}");
    let e = error(&[
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "two"),
    ]);
    assert!(e.contains("OMPI_COMM_WORLD_LOCAL_SIZE=\"two\""), "{e}");
}

#[test]
fn pmi_rules() {
    let spec = member(&[
        ("PMI_RANK", "1"),
        ("PMI_SIZE", "2"),
        ("PMI_LOCAL_SIZE", "2"),
        ("PMI_JOBID", "kvs_1234_0"),
        ("PMIX_NAMESPACE", "ignored"),
    ]);
    assert_eq!(
        spec,
        JobSpec {
            rank: 1,
            nodes: 2,
            rendezvous: Rendezvous::File(private_dir("/tmp".as_ref()).join("hyfi-kvs_1234_0.addr")),
            job: fnv1a(b"kvs_1234_0"),
            token: None,
            launcher: Launcher::Pmi,
        }
    );
    // Hydra's local count works too; PMIX_NAMESPACE is the second key.
    let spec = member(&[
        ("PMI_RANK", "0"),
        ("PMI_SIZE", "3"),
        ("MPI_LOCALNRANKS", "3"),
        ("PMIX_NAMESPACE", "ns"),
    ]);
    assert_eq!(
        spec.rendezvous,
        Rendezvous::File(private_dir("/tmp".as_ref()).join("hyfi-ns.addr"))
    );
    let spec = member(&[("PMI_RANK", "0"), ("PMI_SIZE", "3"), ("HYFI_COORD", "n0:9")]);
    assert_eq!(spec.rendezvous, Rendezvous::Coord("n0:9".into()));
    let e = error(&[("PMI_RANK", "0"), ("PMI_SIZE", "3"), ("PMI_JOBID", "j")]);
    assert!(
        e.contains("a PMI launcher started this process as node 0 of 3"),
        "{e}"
    );
    assert!(e.contains("mpiexec -genv HYFI_COORD"), "{e}");
    let e = error(&[("PMI_RANK", "-1"), ("PMI_SIZE", "3")]);
    assert!(e.contains("PMI_RANK=\"-1\""), "{e}");
}

#[test]
fn ompi_wins_over_slurm() {
    // mpirun inside a Slurm allocation.
    let spec = member(&[
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("HYFI_COORD", "h:1"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "1"),
    ]);
    assert_eq!(spec.launcher, Launcher::OpenMpi);
}

#[test]
fn slurm_derives_the_coordinator() {
    let vars = [
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_STEP_NODELIST", "rack1-node[003-006]"),
        ("SLURM_JOB_NODELIST", "rack1-node[001-010]"),
        ("SLURM_JOB_ID", "4242"),
        ("SLURM_STEP_ID", "1"),
    ];
    let spec = member(&vars);
    let port = slurm_port("slurm-4242.1");
    assert!((20000..60000).contains(&port));
    assert_eq!(
        spec,
        JobSpec {
            rank: 5,
            nodes: 8,
            rendezvous: Rendezvous::Coord(format!("rack1-node003:{port}")),
            job: fnv1a(b"slurm-4242.1"),
            token: None,
            launcher: Launcher::Slurm,
        }
    );
    // Another step of the same job gets another job id (and most likely
    // another port).
    let other = member(&[
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_STEP_NODELIST", "rack1-node[003-006]"),
        ("SLURM_JOB_ID", "4242"),
        ("SLURM_STEP_ID", "2"),
    ]);
    assert_ne!(other.job, spec.job);
}

#[test]
fn slurm_job_nodelist_fallback_and_overrides() {
    let spec = member(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_JOB_NODELIST", "gpu[7,9]"),
        ("SLURM_JOBID", "1"),
    ]);
    let Rendezvous::Coord(c) = spec.rendezvous else {
        panic!("expected a coordinator")
    };
    assert!(c.starts_with("gpu7:"), "{c}");
    let spec = member(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_JOB_NODELIST", "gpu[7,9]"),
        ("HYFI_RENDEZVOUS", "/lustre/x.addr"),
    ]);
    assert_eq!(spec.rendezvous, Rendezvous::File("/lustre/x.addr".into()));
}

#[test]
fn slurm_errors() {
    let e = error(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")]);
    assert!(
        e.contains("Slurm (srun) started this process as node 0 of 2"),
        "{e}"
    );
    assert!(e.contains("SLURM_STEP_NODELIST"), "{e}");
    let e = error(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_STEP_NODELIST", "node[1-"),
    ]);
    assert!(
        e.contains("SLURM_STEP_NODELIST=\"node[1-\"") && e.contains("Slurm host list"),
        "{e}"
    );
    let e = error(&[("SLURM_PROCID", "2"), ("SLURM_NTASKS", "2")]);
    assert!(
        e.contains("SLURM_PROCID=\"2\"") && e.contains("below SLURM_NTASKS"),
        "{e}"
    );
}

#[test]
fn tokens_round_trip() {
    assert_eq!(token_hex(&TOKEN), TOKEN_HEX);
    assert_eq!(parse_token(TOKEN_HEX), Some(TOKEN));
    assert_eq!(parse_token(&TOKEN_HEX.to_uppercase()), Some(TOKEN));
    assert_eq!(parse_token("+0102030405060708090a0b0c0d0e0f"), None);
    let t = random_token();
    assert_eq!(parse_token(&token_hex(&t)), Some(t));
    // Two draws from /dev/urandom colliding would be a broken generator.
    assert_ne!(random_token(), random_token());
    assert_ne!(random_u64(), random_u64());
    assert_ne!(fallback_random(0), fallback_random(1));
}
