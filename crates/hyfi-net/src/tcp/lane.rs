//! Shared-memory lanes between nodes on one host: a link whose two nodes
//! can map each other's memory carries its frames through a ring in shared
//! memory instead of through the kernel's TCP loopback, and keeps its TCP
//! connection for what the ring cannot say: that the peer died (its
//! sockets close with it) and that a sleeping reader has something to read
//! (a *bell*, one byte).
//!
//! Why. Between local nodes a TCP round trip is two syscalls a side and
//! the loopback stack (~7 µs on the 2-vCPU VM spinning), where C MPI's
//! shared memory takes ~1 µs; LU's steps are latency-bound, and LU 512 on
//! 2×1 ran at 0.63× C MPI 2's speed over TCP (BENCHMARKS.md, "Transports").
//!
//! **The region.** Each node makes one memory file (`memfd_create`, so
//! nothing is left in `/dev/shm` by a node that dies) holding one ring per
//! sender rank, each a single-producer single-consumer byte stream: the
//! producer (the sending node, its writers serialised by the link's lock)
//! copies bytes in and publishes `tail`; the consumer (whichever thread of
//! the receiving node holds its reader lock) copies them out and publishes
//! `head`. The frames in the stream are exactly those the socket would
//! carry, decoded by the same incremental decoder, so a frame larger than
//! the ring streams through it in pieces and every header is checked as a
//! socket's are.
//!
//! The region's second and third pages are the node's **host words**
//! ([`HostWords`]): [`HOST_WORDS`] words that this node and every peer it
//! has a lane to read and write atomically, for the layers above (the
//! fork-join layer keeps its processors' pruning words there, so that an
//! idle peer asks for work by writing them). The transport gives them no
//! meaning.
//!
//! **Pairing** (during mesh setup, over the link's authenticated socket):
//! each node offers its region as `(pid, fd, nonce)`; the peer opens
//! `/proc/<pid>/fd/<fd>` only if that names a memory file called
//! `hyfi-lane-<nonce>` (a 128-bit random name: a node on another host, or
//! in another pid namespace, finds no such file), maps it, checks the nonce
//! in its header too, and answers. A link uses its lane only when both
//! nodes mapped the other's region; otherwise it stays plain TCP, silently
//! and correctly. `HYFI_LANES=0` keeps every link on TCP.
//!
//! **Bells, and why no wake-up is lost.** A reader that may sleep is the
//! node's communication thread, in `poll(2)` on the link's socket. Before it
//! sleeps it sets its region's `asleep` and then looks at every ring; a
//! producer publishes `tail` and then looks at `asleep`, and rings (a byte
//! on the socket) if it is set. Both sides order their store before their
//! load with a sequentially consistent fence, so either the reader sees the
//! bytes or the producer sees it asleep (Dekker's pattern). A bell already
//! rung and not yet drained is not rung again (`bell`), and none is rung
//! while the reader's node will read without it: while one of its threads
//! polls the rings (`polling`), or, for bytes only its phase's end waits
//! for, while its master computes (`computing`); each of those threads
//! looks at the rings when it stops (Dekker's pattern again, with the
//! count in place of `asleep`). The other way, a
//! producer whose ring is full sets `want_room`, looks at `head` again, and
//! leaves the rest in the link's backlog; a consumer that frees room and
//! finds `want_room` set rings the producer, whose loop then writes the
//! backlog.
//!
//! **Trust.** The peer is a node of this job that proved it knows the job's
//! token; still, every index read from shared memory is checked
//! (`tail − head` never exceeds the ring), and a ring that breaks that is a
//! protocol error naming the peer, as garbage on a socket is.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use hyfi_core::link::{Attending, HostWords, HOST_WORDS};

use crate::bootstrap::random_token;
use crate::error::NetError;

/// Bytes of one ring's data: a power of two.
const RING: usize = 1 << 20;
/// A ring's header page (indices and flags), then its data.
const SLOT: usize = 4096 + RING;
/// Where the node's host words are ([`HostWords`]): after the region's
/// header page.
const WORDS: usize = 4096;
/// The region's own header page and its host words.
const HEAD: usize = WORDS + HOST_WORDS * 8;
const MAGIC: u64 = u64::from_le_bytes(*b"HYFILANE");
/// What a node says on each link during pairing: magic, pid, fd, ring size,
/// nodes, nonce.
const OFFER_LEN: usize = 8 + 4 + 4 + 8 + 8 + 16;

/// One node's memory file, mapped: its own (the rings it reads) or a
/// peer's (the one ring it writes there).
pub struct Region {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory, valid until `drop`; every
// access to it goes through atomics (indices, flags) or through copies of
// byte ranges that the ring protocol gives to one side at a time.
unsafe impl Send for Region {}
// SAFETY: as for `Send`: shared access is to atomics, and each data range is
// owned by one thread at a time (the producer's under its link's lock, the
// consumer's under the node's reader lock).
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are the mapping made in `map`, unmapped once;
        // the rings that point into it hold an `Arc<Region>`, so none is
        // left.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn name_of(nonce: &[u8; 16]) -> String {
    let hex: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    format!("hyfi-lane-{hex}")
}

/// This node's region while it is offered: the memory file stays open
/// (peers open it through `/proc`) until pairing ends.
struct Offered {
    region: Arc<Region>,
    fd: std::os::fd::OwnedFd,
    nonce: [u8; 16],
}

impl Region {
    fn size(nodes: usize) -> usize {
        HEAD + nodes * SLOT
    }

    /// This node's region, with a ring for each of `nodes` senders (pages
    /// are touched only where a peer writes, so unused rings cost nothing).
    fn create(nodes: usize) -> std::io::Result<Offered> {
        let nonce = random_token();
        let name = std::ffi::CString::new(name_of(&nonce)).expect("no NUL in a hex name");
        // SAFETY: `name` is a valid C string; the flags are memfd's.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by `memfd_create` and is owned here.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let len = Region::size(nodes);
        std::fs::File::from(fd.try_clone()?).set_len(len as u64)?;
        let r = Region::map(&fd, len)?;
        // SAFETY: the header page is mapped and written only here, before
        // the region is offered to anyone.
        unsafe {
            r.base.cast::<u64>().write(MAGIC);
            std::ptr::copy_nonoverlapping(nonce.as_ptr(), r.base.add(8), 16);
        }
        Ok(Offered {
            region: Arc::new(r),
            fd,
            nonce,
        })
    }

    /// Maps `len` bytes of `fd` shared (the mapping outlives the descriptor).
    fn map(fd: &std::os::fd::OwnedFd, len: usize) -> std::io::Result<Region> {
        use std::os::fd::AsRawFd;
        // SAFETY: a shared read-write mapping of a file of at least `len`
        // bytes (checked by the callers); the result is checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Region {
            base: base.cast(),
            len,
        })
    }

    /// Opens a peer's region from its offer, or says why not (then the
    /// link stays on TCP).
    fn open(pid: u32, fd: u32, nodes: usize, nonce: [u8; 16]) -> Result<Region, String> {
        let path = format!("/proc/{pid}/fd/{fd}");
        // Only a memory file of this exact random name is opened: on
        // another host the path names something else or nothing.
        let target = std::fs::read_link(&path).map_err(|e| format!("{path}: {e}"))?;
        let want = format!("/memfd:{} (deleted)", name_of(&nonce));
        if target.as_os_str() != want.as_str() {
            return Err(format!("{path} is not the peer's region"));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| format!("{path}: {e}"))?;
        let len = Region::size(nodes);
        let have = file.metadata().map_err(|e| e.to_string())?.len();
        if have != len as u64 {
            return Err(format!("{path} has {have} bytes, not {len}"));
        }
        let r = Region::map(&file.into(), len).map_err(|e| e.to_string())?;
        // SAFETY: the header page is mapped; it was written before the
        // offer was sent and is not written again.
        let (magic, theirs) = unsafe {
            let mut n = [0u8; 16];
            std::ptr::copy_nonoverlapping(r.base.add(8), n.as_mut_ptr(), 16);
            (r.base.cast::<u64>().read(), n)
        };
        if magic != MAGIC || theirs != nonce {
            return Err(format!("{path}: not a hyfi lane region"));
        }
        Ok(r)
    }

    /// The region's `asleep` flag: its node's communication thread is (about
    /// to be) in `poll`.
    fn asleep(&self) -> &AtomicU32 {
        // SAFETY: offset 64 of the mapped header page, 4-aligned; only
        // accessed atomically.
        unsafe { &*self.base.add(64).cast::<AtomicU32>() }
    }

    /// How many of its node's threads are polling the rings now.
    fn polling(&self) -> &AtomicU32 {
        // SAFETY: offset 128 of the mapped header page (a cache line of its
        // own), 4-aligned; only accessed atomically.
        unsafe { &*self.base.add(128).cast::<AtomicU32>() }
    }

    /// Whether its node's master is computing its share of a phase (0 or
    /// 1): it reads the rings when it stops, so messages only its phase's
    /// end waits for need no bell meanwhile.
    fn computing(&self) -> &AtomicU32 {
        // SAFETY: offset 192 of the mapped header page (a cache line of its
        // own), 4-aligned; only accessed atomically.
        unsafe { &*self.base.add(192).cast::<AtomicU32>() }
    }

    /// Maps sender `sender`'s ring in this process now (its pages made and
    /// its page-table entries filled), so that the run does not take a
    /// page fault on every page of the ring the first time round (a
    /// shared-memory fault costs microseconds). The contents are left as
    /// they are: the peer may be writing already. A kernel without
    /// `MADV_POPULATE_WRITE` (before 5.14) takes the faults as they come.
    fn populate(&self, sender: usize) {
        // SAFETY: the slot's range lies in the mapping; populating changes
        // no byte of it.
        unsafe {
            libc::madvise(self.slot(sender).cast(), SLOT, libc::MADV_POPULATE_WRITE);
        }
    }

    /// The node's host words (the layer that uses them owns their layout).
    fn words(&self) -> &[AtomicU64; HOST_WORDS] {
        // SAFETY: `WORDS..HEAD` of the mapping, page-aligned; zero when the
        // file was made; only accessed atomically, by this node and its
        // peers on the host.
        unsafe { &*self.base.add(WORDS).cast::<[AtomicU64; HOST_WORDS]>() }
    }

    /// Maps the host words' pages now (see [`Region::populate`]).
    fn populate_words(&self) {
        // SAFETY: the range lies in the mapping; populating changes no byte.
        unsafe {
            libc::madvise(
                self.base.add(WORDS).cast(),
                HEAD - WORDS,
                libc::MADV_POPULATE_WRITE,
            );
        }
    }

    fn slot(&self, sender: usize) -> *mut u8 {
        debug_assert!(HEAD + (sender + 1) * SLOT <= self.len);
        // SAFETY: in bounds of the mapping (the region has a slot per node).
        unsafe { self.base.add(HEAD + sender * SLOT) }
    }
}

/// A ring's indices and flags, each on its own cache line.
struct Indices {
    tail: *const AtomicU64,
    head: *const AtomicU64,
    want_room: *const AtomicU32,
    bell: *const AtomicU32,
    data: *mut u8,
}

impl Indices {
    fn of(region: &Region, sender: usize) -> Indices {
        let s = region.slot(sender);
        // SAFETY: the slot's header page is mapped; the offsets are aligned
        // for their atomics and on separate cache lines (the producer
        // writes `tail`, the consumer `head`).
        unsafe {
            Indices {
                tail: s.cast(),
                head: s.add(128).cast(),
                want_room: s.add(256).cast(),
                bell: s.add(384).cast(),
                data: s.add(4096),
            }
        }
    }
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: see `of`; valid while the region (held beside) lives.
        unsafe { &*self.tail }
    }
    fn head(&self) -> &AtomicU64 {
        // SAFETY: see `of`.
        unsafe { &*self.head }
    }
    fn want_room(&self) -> &AtomicU32 {
        // SAFETY: see `of`.
        unsafe { &*self.want_room }
    }
    fn bell(&self) -> &AtomicU32 {
        // SAFETY: see `of`.
        unsafe { &*self.bell }
    }
}

/// The ring's indices say more bytes are in it than it holds: the peer
/// wrote garbage into shared memory.
#[derive(Debug)]
pub struct Broken {
    /// What the indices claim.
    pub used: u64,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "its shared-memory ring claims {} bytes in a ring of {RING}",
            self.used
        )
    }
}

/// One ring of a lane, seen from either end: the producer writes it (the
/// ring this node writes in a peer's region, under the link's lock), the
/// consumer reads it (a ring in this node's region, under the node's reader
/// lock). The link's socket, which the caller owns, carries the bells.
pub struct Ring {
    /// The region the ring lies in (kept mapped while the ring is used).
    region: Arc<Region>,
    ix: Indices,
    /// Bells this end rang (its node's traffic counter, once the link's
    /// writer holds it: [`Ring::counting_bells`]).
    bells: Arc<AtomicU64>,
}

// SAFETY: the raw pointers point into `region`, which the ring keeps alive;
// see `Region`'s `Send`/`Sync`.
unsafe impl Send for Ring {}
// SAFETY: as above; each end's copies are serialised by its owner's lock,
// the rest are atomics.
unsafe impl Sync for Ring {}

impl Ring {
    fn of(region: &Arc<Region>, sender: usize) -> Ring {
        Ring {
            region: region.clone(),
            ix: Indices::of(region, sender),
            bells: Arc::default(),
        }
    }

    /// The producer's end, counting the bells it rings in `bells`.
    pub fn counting_bells(self, bells: Arc<AtomicU64>) -> Ring {
        Ring { bells, ..self }
    }

    /// The producer: copies as much of `buf` as the ring has room for,
    /// publishes it and rings the peer (down `bell`, the link's socket) if
    /// its reader sleeps, unless one of its threads polls, or `for_phase_end`
    /// (only the peer's phase end waits for these bytes) and its master
    /// computes: either reads them soon without being woken. Returns the
    /// bytes taken; fewer than `buf.len()` means the ring is full and the
    /// consumer will ring back when it frees room (`want_room`).
    pub fn write(
        &self,
        buf: &[u8],
        bell: &TcpStream,
        for_phase_end: bool,
    ) -> Result<usize, Broken> {
        let (tail_at, head_at) = (self.ix.tail(), self.ix.head());
        let tail = tail_at.load(Ordering::Relaxed);
        let room = |head: u64| -> Result<usize, Broken> {
            let used = tail.wrapping_sub(head);
            if used > RING as u64 {
                return Err(Broken { used });
            }
            Ok(RING - used as usize)
        };
        let mut free = room(head_at.load(Ordering::Acquire))?;
        if free < buf.len() {
            self.ix.want_room().store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            free = room(head_at.load(Ordering::Acquire))?;
        }
        let n = free.min(buf.len());
        if n == 0 {
            return Ok(0);
        }
        let at = (tail as usize) & (RING - 1);
        let first = n.min(RING - at);
        // SAFETY: `[at, at + first)` and `[0, n - first)` lie in the ring's
        // data and in its free part (between `tail` and `head + RING`),
        // which the consumer does not read until `tail` is published below.
        unsafe {
            std::ptr::copy_nonoverlapping(buf.as_ptr(), self.ix.data.add(at), first);
            std::ptr::copy_nonoverlapping(buf.as_ptr().add(first), self.ix.data, n - first);
        }
        let end = tail.wrapping_add(n as u64);
        tail_at.store(end, Ordering::Release);
        // Dekker with the reader's `asleep` then look (see the module docs).
        fence(Ordering::SeqCst);
        if self.region.asleep().load(Ordering::Relaxed) != 0
            && self.region.polling().load(Ordering::Relaxed) == 0
            && !(for_phase_end && self.region.computing().load(Ordering::Relaxed) != 0)
            // A polling thread may have read these bytes already, and
            // stopped polling since: nothing is left to wake anyone for.
            && head_at.load(Ordering::Acquire) != end
            && self.ix.bell().swap(1, Ordering::SeqCst) == 0
        {
            self.bells.fetch_add(1, Ordering::Relaxed);
            ring(bell);
        }
        Ok(n)
    }

    /// Whether the producer rang this ring's bell and the consumer has not
    /// drained it yet: bytes found now were announced (the byte may still
    /// be on its way, its producer preempted between the two).
    pub fn rung(&self) -> bool {
        self.ix.bell().load(Ordering::SeqCst) != 0
    }

    /// Whether bytes wait in the ring (the consumer's side; any thread).
    pub fn pending(&self) -> bool {
        self.ix.tail().load(Ordering::Acquire) != self.ix.head().load(Ordering::Acquire)
    }

    /// The consumer: copies up to `dst.len()` bytes out of the ring; 0 when
    /// it is empty. Rings the producer (down `bell`) if it waits for room.
    pub fn read(&self, dst: &mut [u8], bell: &TcpStream) -> Result<usize, Broken> {
        let head = self.ix.head().load(Ordering::Relaxed);
        let tail = self.ix.tail().load(Ordering::Acquire);
        let used = tail.wrapping_sub(head);
        if used > RING as u64 {
            return Err(Broken { used });
        }
        let n = (used as usize).min(dst.len());
        if n == 0 {
            return Ok(0);
        }
        let at = (head as usize) & (RING - 1);
        let first = n.min(RING - at);
        // SAFETY: `[head, head + n)` was published by the producer (`tail`
        // loaded with acquire) and is not written again until `head` moves
        // past it below.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ix.data.add(at), dst.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(self.ix.data, dst.as_mut_ptr().add(first), n - first);
        }
        self.ix
            .head()
            .store(head.wrapping_add(n as u64), Ordering::Release);
        fence(Ordering::SeqCst);
        if self.ix.want_room().load(Ordering::Relaxed) != 0
            && self.ix.want_room().swap(0, Ordering::SeqCst) != 0
        {
            ring(bell);
        }
        Ok(n)
    }

    /// The consumer: drains the bells from `sock`, the link's socket (the
    /// bell may be rung again from now on). `Err` if the socket ended or
    /// failed: the peer is gone (the caller reads the ring to its end before
    /// it judges that).
    pub fn drain_bells(&self, sock: &TcpStream) -> Result<(), std::io::Error> {
        self.ix.bell().store(0, Ordering::SeqCst);
        let mut b = [0u8; 64];
        loop {
            match (&*sock).read(&mut b) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                // A short read took every bell there was (no second read to
                // hear `EAGAIN`; `poll` is level-triggered).
                Ok(n) if n < b.len() => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }
}

/// One byte down the link's socket: the peer's `poll` returns. A full socket
/// (it cannot be: bells are rung once until drained) or a closed one (the
/// peer is gone, which its socket says to this node's loop) is ignored.
fn ring(sock: &TcpStream) {
    let _ = (&*sock).write(&[1]);
}

/// This node's side of its lanes: per peer rank, the link's two halves if
/// it has a lane, and the region its peers write into, whose `asleep` flag
/// its communication thread sets before it sleeps.
pub struct Lanes {
    own: Option<Arc<Region>>,
    /// The host words of this node and of its peers over lanes, if it has
    /// a lane.
    pub(crate) words: Option<Arc<LaneWords>>,
    /// Per peer rank: the ring this node writes, if the link has a lane.
    pub(crate) tx: Vec<Option<Ring>>,
    /// Per peer rank: the ring this node reads, if the link has a lane
    /// (shared by its reader and the loop, which looks at it unlocked).
    pub(crate) rx: Vec<Option<Arc<Ring>>>,
}

impl Lanes {
    /// No lanes: every link on TCP.
    pub fn none(nodes: usize) -> Lanes {
        Lanes {
            own: None,
            words: None,
            tx: (0..nodes).map(|_| None).collect(),
            rx: (0..nodes).map(|_| None).collect(),
        }
    }

    /// How many links have a lane.
    pub fn count(&self) -> usize {
        self.rx.iter().flatten().count()
    }

    /// The handle of the communication thread on its region's `asleep` flag.
    pub(crate) fn sleeper(&self) -> Sleeper {
        Sleeper {
            own: self.own.clone(),
        }
    }
}

/// The [`HostWords`] of the nodes this node has lanes to, and its own: a
/// page of each region.
pub struct LaneWords {
    /// Per rank: its region, where this node reaches it.
    regions: Vec<Option<Arc<Region>>>,
}

impl HostWords for LaneWords {
    fn words(&self, node: usize) -> Option<&[AtomicU64; HOST_WORDS]> {
        self.regions.get(node)?.as_ref().map(|r| r.words())
    }
}

/// The communication thread's handle on its region's `asleep` flag.
#[derive(Clone, Default)]
pub(crate) struct Sleeper {
    own: Option<Arc<Region>>,
}

impl Sleeper {
    /// A thread of this node starts (`true`) or stops attending to the
    /// rings: polling them (producers need not ring meanwhile), or, the
    /// master, computing (producers of bytes for the phase's end need not
    /// ring). A thread that stops must then look at the rings once more
    /// (the producer published, then saw it attending: Dekker's pattern
    /// again).
    pub(crate) fn attend(&self, kind: Attending, start: bool) {
        if let Some(own) = &self.own {
            let count = match kind {
                Attending::Polling => own.polling(),
                Attending::Computing => own.computing(),
            };
            if start {
                count.fetch_add(1, Ordering::SeqCst);
            } else {
                count.fetch_sub(1, Ordering::SeqCst);
                fence(Ordering::SeqCst);
            }
        }
    }

    /// Whether a thread of this node attends to the rings now (polls them,
    /// or, the master, computes and reads them when it stops): bytes that
    /// came without a bell are then expected.
    pub(crate) fn attended(&self) -> bool {
        self.own.as_ref().is_some_and(|own| {
            own.polling().load(Ordering::SeqCst) != 0 || own.computing().load(Ordering::SeqCst) != 0
        })
    }

    /// The communication thread is going to sleep in `poll` (true) or has
    /// woken (false). Going to sleep, it must look at every ring afterwards
    /// ([`Ring::pending`]) and not sleep if one has bytes.
    pub(crate) fn set(&self, asleep: bool) {
        if let Some(own) = &self.own {
            own.asleep().store(u32::from(asleep), Ordering::SeqCst);
        }
    }
}

/// Whether lanes are wanted: `HYFI_LANES` unset or not `0`/`off`/`false`.
pub fn wanted() -> Result<bool, NetError> {
    match std::env::var("HYFI_LANES") {
        Err(_) => Ok(true),
        Ok(v) => match v.trim() {
            "" | "1" | "on" | "true" => Ok(true),
            "0" | "off" | "false" => Ok(false),
            _ => Err(NetError::BadEnv {
                var: "HYFI_LANES",
                value: v.clone(),
                expected: "1 (shared-memory lanes between the nodes of one host, the default) \
                           or 0 (every link over TCP)",
            }),
        },
    }
}

fn read_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    s.set_read_timeout(Some(left.max(std::time::Duration::from_millis(1))))?;
    s.read_exact(buf)
}

/// Pairs the links of an established mesh (blocking sockets, before the
/// communication thread starts): every node runs it on every link, in the
/// same order of messages (offers out, offers in, answers out, answers in),
/// whatever it wants, so that a node with `HYFI_LANES=0` offers nothing and
/// answers no. Bounded by `deadline`.
pub fn pair(
    me: usize,
    peers: &mut [Option<TcpStream>],
    want: bool,
    deadline: Instant,
) -> Result<Lanes, NetError> {
    let nodes = peers.len();
    let own = if want {
        match Region::create(nodes) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::debug!("node {me}: no shared-memory lanes: {e}");
                None
            }
        }
    } else {
        None
    };
    let io = |peer: usize, what: &str, e: std::io::Error| {
        NetError::io(
            format!("node {me}: pairing lanes with node {peer}: {what}"),
            e,
        )
    };
    let mut offer = [0u8; OFFER_LEN];
    offer[..8].copy_from_slice(&MAGIC.to_le_bytes());
    if let Some(r) = &own {
        use std::os::fd::AsRawFd;
        offer[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        offer[12..16].copy_from_slice(&(r.fd.as_raw_fd() as u32).to_le_bytes());
        offer[16..24].copy_from_slice(&(RING as u64).to_le_bytes());
        offer[24..32].copy_from_slice(&(nodes as u64).to_le_bytes());
        offer[32..48].copy_from_slice(&r.nonce);
    }
    for (peer, s) in peers.iter_mut().enumerate() {
        if let Some(s) = s {
            s.write_all(&offer).map_err(|e| io(peer, "offering", e))?;
        }
    }
    let mut theirs: Vec<Option<Arc<Region>>> = (0..nodes).map(|_| None).collect();
    for (peer, s) in peers.iter_mut().enumerate() {
        let Some(s) = s else { continue };
        let mut o = [0u8; OFFER_LEN];
        read_by(s, &mut o, deadline).map_err(|e| io(peer, "reading its offer", e))?;
        let word = |r: std::ops::Range<usize>| {
            let mut b = [0u8; 8];
            b[..r.len()].copy_from_slice(&o[r]);
            u64::from_le_bytes(b)
        };
        if word(0..8) != MAGIC {
            return Err(NetError::Protocol {
                me,
                from: peer,
                why: "expected a lane offer during setup".into(),
            });
        }
        let (pid, fd, ring, n) = (word(8..12), word(12..16), word(16..24), word(24..32));
        if own.is_none() || pid == 0 || ring != RING as u64 || n != nodes as u64 {
            continue;
        }
        let nonce: [u8; 16] = o[32..48].try_into().expect("16 bytes");
        match Region::open(pid as u32, fd as u32, nodes, nonce) {
            Ok(r) => theirs[peer] = Some(Arc::new(r)),
            Err(why) => tracing::debug!("node {me}: no lane to node {peer}: {why}"),
        }
    }
    for (peer, s) in peers.iter_mut().enumerate() {
        if let Some(s) = s {
            let yes = u8::from(theirs[peer].is_some());
            s.write_all(&[yes]).map_err(|e| io(peer, "answering", e))?;
        }
    }
    let mut lanes = Lanes::none(nodes);
    let mut words: Vec<Option<Arc<Region>>> = (0..nodes).map(|_| None).collect();
    for (peer, s) in peers.iter_mut().enumerate() {
        let Some(s) = s else { continue };
        let mut yes = [0u8; 1];
        read_by(s, &mut yes, deadline).map_err(|e| io(peer, "reading its answer", e))?;
        s.set_read_timeout(None)
            .map_err(|e| io(peer, "set_read_timeout", e))?;
        let (Some(peer_region), Some(own), 1) = (theirs[peer].take(), own.as_ref(), yes[0]) else {
            continue;
        };
        peer_region.populate(me);
        peer_region.populate_words();
        own.region.populate(peer);
        lanes.tx[peer] = Some(Ring::of(&peer_region, me));
        words[peer] = Some(peer_region.clone());
        lanes.rx[peer] = Some(Arc::new(Ring::of(&own.region, peer)));
    }
    // Every peer has answered, so has opened the memory file or never
    // will: it closes here, and the mapping stays.
    lanes.own = own.map(|o| o.region);
    if let (Some(own), true) = (&lanes.own, words.iter().any(Option::is_some)) {
        own.populate_words();
        words[me] = Some(own.clone());
        lanes.words = Some(Arc::new(LaneWords { regions: words }));
    }
    Ok(lanes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two halves of one ring in one process: what goes in comes out, in
    /// order, across the wrap, and a full ring takes only what fits.
    #[test]
    fn a_ring_carries_a_stream_across_its_wrap() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        let own = Region::create(2).unwrap().region;
        // The two ends of one ring, as a producer and a consumer hold them.
        let (tx, rx) = (Ring::of(&own, 1), Ring::of(&own, 1));
        let msg: Vec<u8> = (0..RING as u32 / 3 + 7)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let mut got = Vec::new();
        let mut out = vec![0u8; 4096 + 3];
        for _ in 0..10 {
            let mut off = 0;
            while off < msg.len() {
                off += tx.write(&msg[off..], &a, false).unwrap();
                let n = rx.read(&mut out, &b).unwrap();
                got.extend_from_slice(&out[..n]);
            }
            while let Ok(n @ 1..) = rx.read(&mut out, &b) {
                got.extend_from_slice(&out[..n]);
            }
        }
        assert_eq!(got.len(), msg.len() * 10);
        for (k, chunk) in got.chunks(msg.len()).enumerate() {
            assert_eq!(chunk, &msg[..], "copy {k}");
        }
        // Full: a ring takes RING bytes and no more until read.
        let big = vec![5u8; RING + 100];
        assert_eq!(tx.write(&big, &a, false).unwrap(), RING);
        assert_eq!(tx.write(&big, &a, false).unwrap(), 0);
        assert!(rx.pending());
    }

    /// A producer rings a sleeping reader unless the reader's node will
    /// read soon without it: a thread of it polls (any bytes), or its
    /// master computes and the bytes are for its phase's end. Each bell is
    /// counted, and none is rung twice before the reader drains it.
    #[test]
    fn a_sleeping_reader_is_rung_unless_its_node_will_read_anyway() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        b.set_nonblocking(true).unwrap();
        let own = Region::create(2).unwrap().region;
        let bells = Arc::new(AtomicU64::new(0));
        let (tx, rx) = (
            Ring::of(&own, 1).counting_bells(bells.clone()),
            Ring::of(&own, 1),
        );
        let reader = Sleeper {
            own: Some(own.clone()),
        };
        // Writes one byte (prompt, or for the phase's end); whether a bell
        // came down the socket, the ring and the bell drained after.
        let rung = |for_phase_end: bool| {
            assert_eq!(tx.write(&[7], &a, for_phase_end).unwrap(), 1);
            let mut one = [0u8; 1];
            let mut came = false;
            let until = Instant::now() + std::time::Duration::from_secs(10);
            // A bell is a byte on loopback TCP: give it time to arrive;
            // absent, wait a moment only (nothing is then on its way).
            let patience = if tx.ix.bell().load(Ordering::SeqCst) != 0 {
                until
            } else {
                Instant::now()
            };
            loop {
                match (&b).read(&mut one) {
                    Ok(1) => {
                        came = true;
                        break;
                    }
                    _ if Instant::now() >= patience => break,
                    _ => std::thread::yield_now(),
                }
            }
            rx.drain_bells(&b).unwrap();
            let mut out = [0u8; 8];
            assert_eq!(rx.read(&mut out, &a).unwrap(), 1);
            came
        };
        // Awake: nobody is rung.
        assert!(!rung(false));
        reader.set(true);
        assert!(rung(false), "asleep, nobody attending: rung");
        assert!(
            rung(true),
            "asleep, nobody attending: rung for the phase's end too"
        );
        reader.attend(Attending::Computing, true);
        assert!(
            !rung(true),
            "the master computes: bytes for the phase's end wait"
        );
        assert!(rung(false), "the master computes: a request still rings");
        reader.attend(Attending::Polling, true);
        assert!(!rung(false), "a thread polls: nothing rings");
        reader.attend(Attending::Polling, false);
        reader.attend(Attending::Computing, false);
        assert!(rung(true), "the master stopped: rung again");
        assert_eq!(bells.load(Ordering::SeqCst), 4);
    }

    /// Indices that claim more than the ring holds are garbage, reported.
    #[test]
    fn broken_indices_are_an_error_not_a_read_out_of_bounds() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let own = Region::create(2).unwrap().region;
        let rx = Ring::of(&own, 0);
        rx.ix.tail().store(RING as u64 * 3, Ordering::Release);
        let mut out = [0u8; 16];
        let e = rx.read(&mut out, &a).unwrap_err();
        assert!(e.to_string().contains("claims"), "{e}");
    }
}
