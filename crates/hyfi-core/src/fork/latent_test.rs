//! Tests of latent joins (`super::latent`): the slot protocol on one
//! processor, a listed join claimed by an idle processor of the node, a
//! panic in the first branch while the second runs elsewhere, and a listed
//! `join_remote` shipped to another node by the donor's steal answer.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::join::Pair;
use super::latent::{Listing, BATCH, SLOTS};
use crate::job::StackJob;
use crate::layer::RuntimeExt;
use crate::link::InProcess;
use crate::remote::join::RemotePair;
use crate::{Config, Ctx, NodeLink, RemoteFn, Runtime};

/// Spins until `flag` is set; panics (failing the test, never hanging it)
/// after `LIMIT`.
fn wait_for(flag: &AtomicBool, what: &str) {
    const LIMIT: Duration = Duration::from_secs(30);
    let t = Instant::now();
    while !flag.load(Ordering::SeqCst) {
        assert!(
            t.elapsed() < LIMIT,
            "{what} did not happen within {LIMIT:?}"
        );
        std::hint::spin_loop();
    }
}

#[test]
fn a_listing_is_claimed_once_and_its_owner_learns_it_at_unlisting_or_withdrawal() {
    // One processor on one node: nobody else claims, so every outcome here
    // is the test's own doing.
    let rt = Runtime::new(Config::new().procs(1).pin(false).latent_joins(true)).unwrap();
    rt.run(|ctx| {
        let slots = &ctx.ws().latent;
        // Unclaimed: the owner keeps the second branch.
        let job = StackJob::new(|_: &Ctx| 7u64);
        let l = Listing::new(job.as_job_ref());
        assert!(ctx.list(&l));
        assert!(!ctx.unlist(&l), "nobody claimed it");
        assert!(slots.claim(false).is_none(), "unlisted means gone");

        // Claimed: the claimer owns the job, once; the owner waits for it.
        let job = StackJob::new(|_: &Ctx| 8u64);
        let l = Listing::new(job.as_job_ref());
        assert!(ctx.list(&l));
        assert!(
            slots.claim(true).is_none(),
            "a plain join's branch may not leave the node"
        );
        let j = slots.claim(false).expect("the listed job");
        assert!(slots.claim(false).is_none(), "a job is claimed once");
        // SAFETY: claimed above: this test owns the job, whose frame is
        // this one.
        unsafe { j.execute(ctx) };
        assert!(ctx.unlist(&l), "the owner learns of the claim");
        job.latch.wait();
        assert_eq!(job.into_result(), 8);

        // Withdrawn (its filthread suspended): unclaimed stays ours,
        // claimed stays claimed, and the slots are empty again.
        let (ja, jb) = (StackJob::new(|_: &Ctx| 1u64), StackJob::new(|_: &Ctx| 2u64));
        let (la, lb) = (Listing::new(ja.as_job_ref()), Listing::new(jb.as_job_ref()));
        assert!(ctx.list(&la) && ctx.list(&lb));
        let j = slots.claim(false).expect("the lower listing");
        ctx.withdraw_listings();
        assert!(slots.claim(false).is_none(), "withdrawn listings are gone");
        assert!(!ctx.unlist(&lb), "withdrawn unclaimed: ours");
        // SAFETY: claimed above.
        unsafe { j.execute(ctx) };
        assert!(ctx.unlist(&la), "claimed before the withdrawal");
        assert_eq!(ja.into_result(), 1);

        // At most SLOTS at once; a batch disarms.
        let jobs: Vec<_> = (0..=SLOTS as u64)
            .map(|i| StackJob::new(move |_: &Ctx| i))
            .collect();
        let ls: Vec<_> = jobs.iter().map(|j| Listing::new(j.as_job_ref())).collect();
        ctx.latent_armed.set(true);
        for (i, l) in ls.iter().enumerate() {
            assert_eq!(ctx.list(l), i < SLOTS, "listing {i}");
            if i + 1 == BATCH {
                assert!(!ctx.latent_armed.get(), "a batch disarms");
            }
        }
        for l in ls[..SLOTS].iter().rev() {
            assert!(!ctx.unlist(l));
        }
        assert_eq!(ctx.latent_len.get(), 0);
    })
    .unwrap();
}

#[test]
fn an_idle_processor_claims_a_listed_join_while_its_first_branch_runs() {
    let rt = Runtime::new(Config::new().procs(2).pin(false).latent_joins(true)).unwrap();
    for round in 0..3 {
        rt.reset_stats();
        let b_ran = Arc::new(AtomicBool::new(false));
        let (a_proc, b_proc) = rt
            .run(|ctx| {
                let b_ran2 = b_ran.clone();
                // The first branch makes no join, so no real fork can serve
                // the idle processor: only the listing can.
                ctx.join_listed(Pair(
                    |c: &Ctx| {
                        wait_for(&b_ran, "the second branch");
                        c.proc()
                    },
                    move |c: &Ctx| {
                        b_ran2.store(true, Ordering::SeqCst);
                        c.proc()
                    },
                ))
            })
            .unwrap();
        assert_ne!(
            a_proc, b_proc,
            "round {round}: both branches ran on one processor"
        );
        let t = rt.stats().total();
        assert_eq!(t.steals_latent, 1, "round {round}: {t:?}");
    }
}

#[test]
fn a_panic_in_the_first_branch_waits_for_the_claimed_second() {
    let rt = Runtime::new(Config::new().procs(2).pin(false).latent_joins(true)).unwrap();
    let b_started = Arc::new(AtomicBool::new(false));
    let b_done = Arc::new(AtomicBool::new(false));
    let (s, d) = (b_started.clone(), b_done.clone());
    let r = rt.run(move |ctx| {
        let (s2, d2) = (s.clone(), d.clone());
        ctx.join_listed(Pair(
            move |_: &Ctx| {
                wait_for(&s, "the claim");
                panic!("boom in the first branch");
            },
            move |_: &Ctx| {
                s2.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
                d2.store(true, Ordering::SeqCst);
            },
        ))
    });
    assert!(r.is_err(), "the panic reaches the caller");
    assert!(
        b_done.load(Ordering::SeqCst),
        "the join returned before its claimed branch had finished"
    );
    // The runtime survives.
    assert_eq!(rt.run(|ctx| ctx.join(|_| 1, |_| 2)).unwrap(), (1, 2));
}

/// Where `TAG` ran, and with what.
static SHIPPED_RAN_ON: AtomicUsize = AtomicUsize::new(usize::MAX);
static SHIPPED_RAN: AtomicBool = AtomicBool::new(false);
static SHIPPED_ARG: AtomicU64 = AtomicU64::new(0);

fn tag(ctx: &Ctx, x: u64) -> u64 {
    SHIPPED_RAN_ON.store(ctx.node(), Ordering::SeqCst);
    SHIPPED_ARG.store(x, Ordering::SeqCst);
    SHIPPED_RAN.store(true, Ordering::SeqCst);
    x * 3
}
static TAG: RemoteFn<u64, u64> = RemoteFn::new("fork::latent_test::tag", tag);

#[test]
fn another_node_gets_a_listed_join_remote_through_the_donors_steal_answer() {
    TAG.register().unwrap();
    let links = InProcess::connect(2);
    let nodes: Vec<_> = links
        .into_iter()
        .map(|link| {
            std::thread::spawn(move || {
                let rt = Runtime::with_link(
                    Config::new().procs(1).pin(false).latent_joins(true),
                    link as Arc<dyn NodeLink>,
                )
                .unwrap();
                crate::steal::install(&rt).unwrap();
                let out = rt
                    .run_distributed(|ctx| {
                        // Node 0's one processor spins in the first branch:
                        // only its steal answer can give node 1 the second.
                        ctx.join_listed(RemotePair {
                            a: |_: &Ctx| {
                                wait_for(&SHIPPED_RAN, "the shipped branch");
                                1u64
                            },
                            f: &TAG,
                            b: 14u64,
                        })
                    })
                    .unwrap();
                (out, rt.stats())
            })
        })
        .collect();
    let got: Vec<_> = nodes.into_iter().map(|h| h.join().unwrap()).collect();
    for (out, _) in &got {
        assert_eq!(*out, (1, 42), "every node returns the root's result");
    }
    assert_eq!(SHIPPED_RAN_ON.load(Ordering::SeqCst), 1, "it ran on node 1");
    assert_eq!(SHIPPED_ARG.load(Ordering::SeqCst), 14);
    let r = &got[0].1.remote;
    assert_eq!(r.latent_exported, 1, "{r:?}");
    assert_eq!(r.requests_served, 1, "{r:?}");
}
