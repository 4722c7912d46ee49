//! The communication thread's tasks: a reader per link, heartbeats,
//! strays refused.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::sync::mpsc::unbounded_channel;

use hyfi_core::link::Class;

use crate::error::NetError;
use crate::mesh::Links;
use crate::wire::{self, Header, Kind, Msg, HANDSHAKE_LEN, HEADER_LEN};

use super::inbox::Dir;
use super::service::{split_service_tag, SERVICE_TAG};
use super::stats::NetStats;
use super::tx::Sender;
use super::FailureHook;

/// What the communication thread's tasks share: the node's sending side
/// (and through it the inbox) and its failure hook.
#[derive(Clone)]
pub(super) struct Node {
    pub(super) sender: Sender,
    pub(super) hook: Arc<FailureHook>,
}

impl Node {
    /// The node fails with `why`: the first time, its program's waits
    /// return the error, the hook runs, and every peer is told.
    pub(super) fn fail(&self, why: String) {
        if self.sender.fail_and_tell(why.clone()) {
            (self.hook)(&why);
        }
    }
}

/// Milliseconds since `t0`, for the last-heard stamps.
pub(super) fn millis(t0: Instant) -> u64 {
    t0.elapsed().as_millis() as u64
}

pub(super) async fn run(links: Links, node: Node, heartbeat: Duration) {
    let me = links.rank;
    let nodes = links.nodes;
    let (done_tx, mut done_rx) = unbounded_channel::<()>();
    let t0 = Instant::now();
    // When each peer was last heard from, and whether its link is still
    // read (a link that ended cleanly is not expected to talk).
    let heard: Arc<Vec<AtomicU64>> = Arc::new((0..nodes).map(|_| AtomicU64::new(0)).collect());
    let open: Arc<Vec<std::sync::atomic::AtomicBool>> = Arc::new(
        (0..nodes)
            .map(|p| std::sync::atomic::AtomicBool::new(p != me))
            .collect(),
    );
    let mut tasks = 0usize;
    for (peer, stream) in links.peers.into_iter().enumerate() {
        let Some(stream) = stream else { continue };
        let stream = match tokio::net::TcpStream::from_std(stream) {
            Ok(s) => s,
            Err(e) => {
                node.fail(format!("node {me}: link to node {peer} unusable: {e}"));
                continue;
            }
        };
        // Writes go through the std clone in PeerTx; the reader task gets
        // the whole stream (not a split half: dropping tokio's write half
        // would shut our sending side down).
        tasks += 1;
        let (d, n, h, o) = (done_tx.clone(), node.clone(), heard.clone(), open.clone());
        tokio::spawn(async move {
            if let Some(why) = read_frames(me, peer, stream, &n, &h[peer], t0).await {
                n.fail(why);
            }
            o[peer].store(false, Ordering::SeqCst);
            let _ = d.send(());
        });
    }
    for l in links.listeners {
        if let Ok(l) = tokio::net::TcpListener::from_std(l) {
            let st = node.sender.stats.clone();
            tokio::spawn(refuse_strays(me, l, st));
        }
    }
    tokio::spawn(heartbeats(me, node.clone(), heard, open, t0, heartbeat));
    drop(done_tx);
    for _ in 0..tasks {
        if done_rx.recv().await.is_none() {
            break;
        }
    }
}

/// Sends a heartbeat to every peer at a quarter of the limit, and fails
/// the node when a peer whose link is open has been silent past it.
pub(super) async fn heartbeats(
    me: usize,
    node: Node,
    heard: Arc<Vec<AtomicU64>>,
    open: Arc<Vec<std::sync::atomic::AtomicBool>>,
    t0: Instant,
    limit: Duration,
) {
    let every = (limit / 4).max(Duration::from_millis(10));
    let frame = wire::control_frame(&Msg::Heartbeat);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_tick = millis(t0);
    loop {
        tick.tick().await;
        if node.sender.inbox.failure().is_some() {
            return;
        }
        let now = millis(t0);
        // If this thread itself did not run for a while (the process was
        // stopped, or starved), the peers' heartbeats wait unread in the
        // sockets: let the readers take them before judging anyone.
        let late = now.saturating_sub(last_tick) > 2 * every.as_millis() as u64;
        last_tick = now;
        for peer in 0..heard.len() {
            if !open[peer].load(Ordering::SeqCst) {
                continue;
            }
            // Not counted as traffic: it is the link's own upkeep.
            let _ = node.sender.push(peer, frame.clone(), true);
            let silent = now.saturating_sub(heard[peer].load(Ordering::Relaxed));
            if silent > limit.as_millis() as u64 && !late {
                node.fail(
                    NetError::LostNode {
                        me,
                        lost: peer,
                        why: format!(
                            "it stopped answering: nothing, not even a heartbeat, for {:.1} s \
                             (HYFI_HEARTBEAT={}): it is hung, stopped (SIGSTOP) or cut off \
                             from this node",
                            silent as f64 / 1000.0,
                            limit.as_secs_f64()
                        ),
                    }
                    .to_string(),
                );
                return;
            }
        }
    }
}

/// Reads one link's frames into the inbox until the link ends. Returns why
/// it ended as a failure, or `None` if the peer said `Bye` first.
pub(super) async fn read_frames(
    me: usize,
    peer: usize,
    r: tokio::net::TcpStream,
    node: &Node,
    heard: &AtomicU64,
    t0: Instant,
) -> Option<String> {
    let (inbox, stats) = (&*node.sender.inbox, &*node.sender.stats);
    let lost = |why: String| {
        Some(
            NetError::LostNode {
                me,
                lost: peer,
                why,
            }
            .to_string(),
        )
    };
    let protocol = |why: String| {
        Some(
            NetError::Protocol {
                me,
                from: peer,
                why,
            }
            .to_string(),
        )
    };
    let spmd = |why: &dyn std::fmt::Display| Some(format!("node {me}: {why}"));
    let step = |w: [u64; 4]| hyfi_core::Step::from_words(w);
    // Buffered: a frame's header and payload usually arrive in one read.
    let mut r = tokio::io::BufReader::with_capacity(64 * 1024, r);
    let mut said_bye = false;
    loop {
        heard.store(millis(t0), Ordering::Relaxed);
        let mut h = [0u8; HEADER_LEN];
        if let Err(e) = r.read_exact(&mut h).await {
            if said_bye {
                return None;
            }
            return lost(if e.kind() == std::io::ErrorKind::UnexpectedEof {
                "its connection closed".to_string()
            } else {
                e.to_string()
            });
        }
        let h = match Header::decode(&h) {
            Ok(h) => h,
            Err(why) => return protocol(why.to_string()),
        };
        let mut payload = vec![0u8; h.len as usize];
        if let Err(e) = r.read_exact(&mut payload).await {
            return lost(format!("in the middle of a frame: {e}"));
        }
        let bytes = (HEADER_LEN + payload.len()) as u64;
        match h.kind {
            Kind::Bulk => {
                let class = if h.tag & SERVICE_TAG != 0 {
                    split_service_tag(h.tag).1
                } else {
                    Class::Bulk
                };
                stats.count_received(class, bytes);
                if h.tag & SERVICE_TAG != 0 {
                    if let Err(why) = inbox.services.to_service(peer, h.tag, payload) {
                        return protocol(why.to_string());
                    }
                } else {
                    inbox.put_bulk(peer, h.tag, payload);
                }
            }
            Kind::Control => {
                let msg = wire::decode_msg(&payload);
                if !matches!(msg, Ok(Msg::Heartbeat)) {
                    stats.control_received.fetch_add(1, Ordering::Relaxed);
                    stats
                        .control_bytes_received
                        .fetch_add(bytes, Ordering::Relaxed);
                }
                match msg {
                    Ok(Msg::Up { seq, data }) => inbox.put_coll(peer, seq, Dir::Up, data),
                    Ok(Msg::Down { seq, data }) => inbox.put_coll(peer, seq, Dir::Down, data),
                    Ok(Msg::Heartbeat) => {}
                    Ok(Msg::Step { n, step: w }) => {
                        let Some(theirs) = step(w) else {
                            return protocol(format!("a step {w:?} that is none"));
                        };
                        let r = {
                            let mut s = inbox.state.lock().unwrap_or_else(|e| e.into_inner());
                            match s.steps.as_mut() {
                                Some(st) => st.on_step(peer, n, theirs),
                                None => Ok(()),
                            }
                        };
                        if let Err(why) = r {
                            return spmd(&why);
                        }
                    }
                    // The peer is going away; whatever follows changes nothing.
                    Ok(Msg::Abort { cause }) => {
                        return Some(format!("node {peer} aborted the job: {cause}"))
                    }
                    Ok(Msg::Bye { steps, last }) => {
                        said_bye = true;
                        let last = if last == [0; 4] { None } else { step(last) };
                        if let Err(why) = inbox.bye(peer, steps, last) {
                            return spmd(&why);
                        }
                    }
                    Ok(other) => return protocol(format!("unexpected {other:?}")),
                    Err(why) => return protocol(why.to_string()),
                }
            }
        }
    }
}

/// After setup, any connection to our listeners is a stray (a port scan,
/// a node of another job, garbage): read what it says, log it (rate-limited:
/// a flood costs a few lines and a count), drop it.
pub(super) async fn refuse_strays(me: usize, l: tokio::net::TcpListener, stats: Arc<NetStats>) {
    let log = Arc::new(crate::refusal::RefusalLog::new(me));
    let wait = crate::mesh::HANDSHAKE_WAIT;
    loop {
        let (mut s, from) = match l.accept().await {
            Ok(c) => c,
            // Out of descriptors under a flood, say: refusing must go on.
            Err(e) => {
                if let Some(after) = log.refuse("(accept)", e) {
                    let log = log.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(after).await;
                        log.tick();
                    });
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        stats.refused.fetch_add(1, Ordering::Relaxed);
        let log = log.clone();
        tokio::spawn(async move {
            let mut b = [0u8; HANDSHAKE_LEN];
            let why = match tokio::time::timeout(wait, s.read_exact(&mut b)).await {
                Ok(Ok(_)) => match wire::Handshake::decode(&b) {
                    Ok(h) => format!(
                        "a handshake from rank {} of job {} after setup ended",
                        h.rank, h.job
                    ),
                    Err(why) => why.to_string(),
                },
                Ok(Err(e)) => format!("no handshake: {e}"),
                Err(_) => format!("no handshake within {} s", wait.as_secs()),
            };
            drop(s);
            // The held-back lines are summed up even if no stray follows.
            if let Some(after) = log.refuse(from, why) {
                tokio::time::sleep(after).await;
                log.tick();
            }
        });
    }
}
