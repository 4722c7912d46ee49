//! Accepting during setup: a thread per pending connection, so that
//! strangers cannot stall start-up. Each incoming connection gets
//! [`HANDSHAKE_WAIT`] to prove itself on a thread of its own; at most
//! [`MAX_PENDING`] are in handshake at once; those that prove themselves are
//! handed to the setup thread, the others are logged and dropped.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::error::NetError;

use super::handshake::{Admitted, Gate};
use super::{HANDSHAKE_WAIT, MAX_PENDING, POLL};

/// Accepts connections on a thread of its own and hands over those that
/// proved themselves; stops (and is joined) on drop.
pub(super) struct Acceptor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    admitted: Receiver<Admitted>,
}

impl Acceptor {
    pub(super) fn start(
        l: &TcpListener,
        gate: Gate,
        deadline: Instant,
    ) -> Result<Acceptor, NetError> {
        let l = l
            .try_clone()
            .map_err(|e| NetError::io("cloning the listener", e))?;
        l.set_nonblocking(true)
            .map_err(|e| NetError::io("set_nonblocking", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, admitted) = mpsc::channel();
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("hyfi-accept-{}", gate.me))
            .spawn(move || accept_loop(l, Arc::new(gate), deadline, st, tx))
            .map_err(|e| NetError::io("starting the accepting thread", e))?;
        Ok(Acceptor {
            stop,
            thread: Some(thread),
            admitted,
        })
    }

    /// The next admitted connection, or `None` at the deadline.
    pub(super) fn next(&self, deadline: Instant) -> Option<Admitted> {
        let left = deadline.saturating_duration_since(Instant::now());
        // An error is the deadline, or the accepting thread's end (its
        // deadline passed): nobody else is coming either way.
        self.admitted.recv_timeout(left).ok()
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    l: TcpListener,
    gate: Arc<Gate>,
    deadline: Instant,
    stop: Arc<AtomicBool>,
    tx: Sender<Admitted>,
) {
    let pending = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        gate.log.tick();
        let (s, from) = match l.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(POLL);
                continue;
            }
            Err(e) => {
                // Out of descriptors, say: wait for some to close.
                gate.log.refuse("(accept)", e);
                std::thread::sleep(POLL * 20);
                continue;
            }
        };
        if pending.load(Ordering::Relaxed) >= MAX_PENDING {
            gate.log.refuse(
                from,
                format!("{MAX_PENDING} connections are already in handshake"),
            );
            continue;
        }
        if s.set_nonblocking(false).is_err() {
            continue;
        }
        pending.fetch_add(1, Ordering::Relaxed);
        let (g, p, tx) = (gate.clone(), pending.clone(), tx.clone());
        let until = deadline.min(Instant::now() + HANDSHAKE_WAIT);
        let spawned = std::thread::Builder::new()
            .name("hyfi-handshake".into())
            .stack_size(128 << 10)
            .spawn(move || {
                match g.admit(s, until) {
                    Ok(a) => {
                        let _ = tx.send(a);
                    }
                    Err(why) => {
                        g.log.refuse(from, why);
                    }
                }
                p.fetch_sub(1, Ordering::Relaxed);
            });
        if let Err(e) = spawned {
            pending.fetch_sub(1, Ordering::Relaxed);
            gate.log
                .refuse(from, format!("no thread for its handshake: {e}"));
        }
    }
}
