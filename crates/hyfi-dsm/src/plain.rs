//! Plain-store write views: when a write view may store with plain
//! (non-atomic) moves, which the compiler vectorises, instead of relaxed
//! atomics, which it never does.
//!
//! **The rule.** A write view taken in a phase's bind
//! ([`DsmMatrix::write_rows`], [`DsmVec::write_range`]) stores plainly when
//! nothing else on this node touches its bytes while it lives, and the page
//! server never copies them meanwhile. Node-locally that holds when every
//! access to the array in the phase goes through write views whose
//! footprints do not overlap: Jacobi's `new`, a diffusion's output grid,
//! matmul's rows of C. It does not hold for in-place updates whose write
//! views overlap (red-black SOR's halo) or whose filaments also read or
//! write the array through the checked accessors (`get`, `set`, `row`,
//! `slice`, ...).
//!
//! **How it is decided.** A view's bytes must be plain or atomic from its
//! first store on, before the phase has shown what else it does. So the
//! decision comes from the phase's *previous* execution, keyed by the array,
//! the phase (`CtxExt::phase_key`: program and phase index) and the call
//! site of the view (`#[track_caller]`): if the last two epochs in which
//! views from that site and phase wrote the array were *clean* — written
//! only through pairwise disjoint write views, with no checked access to
//! it at all — and *steady*, the later one's views inside the earlier
//! one's footprints (the same views, or fewer and smaller ones, as a
//! factorization's trailing rows), this epoch's views of the array are
//! plain. A phase's first two executions
//! are atomic; a steady-state iteration is plain. One clean execution is
//! not enough: a wavefront's phase (tiles of an anti-diagonal, each view
//! covering the row above its tile) takes one view in its first execution
//! and two overlapping ones in its second, and footprints that change
//! between executions are what makes a plain view's claim meet another
//! (which is refused, below). Each array's mode word (footprint.rs) records it per
//! access epoch: `VIEWS` (written through disjoint atomic views so far,
//! clean so far) or `PLAIN`; any checked access or overlapping view turns
//! `VIEWS` into `WRITTEN` (not clean). Checked reads, which claim nothing
//! otherwise, test the word's view bit (one load and a branch) so that they
//! are seen too.
//!
//! Which path a view took is visible: [`WriteRows::plain_stores`], and the
//! DSM's counters `plain_views` and `atomic_views` (`Dsm::stats`).
//!
//! ```
//! use hyfi::{Config, Control, PoolArray, Program, Runtime};
//! use std::sync::Mutex;
//! let rt = Runtime::new(Config::new().procs(2).pin(false))?;
//! let dsm = hyfi::Dsm::new(&rt)?;
//! let (rows, n) = (16, 64);
//! let a = dsm.matrix::<f64>(rows, n).from_fn(|i, j| (i + j) as f64)?;
//! let b = dsm.matrix::<f64>(rows, n).zeroed()?;
//! let plain = Mutex::new(Vec::new());
//! let mut prog = Program::new();
//! prog.phase_with(
//!     PoolArray::block(&rt, 0..rows, 1),
//!     |ctx, span| (a.read_rows(ctx, span.rows()), b.write_rows(ctx, span.rows())),
//!     |ctx, i, (a, b)| {
//!         plain.lock().unwrap().push((ctx.iteration(), b.plain_stores()));
//!         let row = a.row(i);
//!         b.row_mut(i).fill(0..n, |j| 2.0 * row[j]);
//!     },
//!     |post| if post.iteration() < 2 { Control::Continue } else { Control::Done },
//! );
//! rt.start(&mut prog)?;
//! drop(prog);
//! // The phase's first two executions store atomically; the next ones,
//! // whose previous two wrote `b` through the same disjoint views, plainly.
//! for (k, p) in plain.into_inner().unwrap() {
//!     assert_eq!(p, k > 1);
//! }
//! assert_eq!(b.get(3, 5), 16.0);
//! // One view per chunk: each processor's 8 rows cut in 8 chunks
//! // (`Config::chunks`), 16 views an execution.
//! let st = dsm.stats().total;
//! assert_eq!((st.atomic_views, st.plain_views), (32, 16));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **Soundness on the node.** In a `PLAIN` epoch, every view's footprint is
//! recorded as a claim (its elements, and the chunk of the phase that took
//! it: `hyfi_core::filthread::current_work`). Claims never overlap another
//! chunk's (a view that would is refused with a panic), and a checked
//! access — which in a `PLAIN` epoch always takes its slow path — into
//! another chunk's claim panics too: it would race with plain stores, and
//! the previous executions of the phase showed no such access, so the
//! program's access pattern changed between iterations. The message names
//! the array and element and the remedy (`HYFI_PLAIN_STORES=0`). Claims
//! are the chunk's, not the filthread's: two chunks may run one after the
//! other on one filthread or at once on two processors, as timing and
//! within-node balancing decide, and the verdict must not depend on which.
//! Accesses of one chunk are ordered by the thread that runs it; bytes outside every claim (padding, edge rows no
//! view covers) are accessed atomically as before. Claims last to the end
//! of the access epoch, when the runtime calls the DSM with no filament
//! running: the epoch's outcome is recorded and the word reset.
//!
//! **Soundness against the page server** (core/plain.rs): other nodes'
//! requests for a home page that a live plain view covers are served once
//! no plain view covering it is active; see there.
//!
//! **Rows lent as `&mut [T]`** (`WriteRows::with_row`,
//! `WriteRange::with_slice`): a plain view may lend a row of its claim to
//! a closure as the shared bytes themselves, which the compiler then
//! treats as unaliased. What keeps every other access away from them while
//! the closure lives, on this thread, on others and in the page server, is
//! argued on the crate-private `Loan` (plain.rs).
//!
//! [`DsmMatrix::write_rows`]: crate::DsmMatrix::write_rows
//! [`DsmVec::write_range`]: crate::DsmVec::write_range
//! [`WriteRows::plain_stores`]: crate::WriteRows::plain_stores

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Range;
use std::panic::Location;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

/// Where a view was taken: its call site, and the phase it was taken in
/// (`CtxExt::phase_key`): a helper that takes views for several phases is
/// one call site, but each phase has its own history.
pub(crate) type Site = (&'static Location<'static>, u64);

/// Whether plain-store views are on (`HYFI_PLAIN_STORES`, default on).
static ENABLED: AtomicBool = AtomicBool::new(true);

/// Reads `HYFI_PLAIN_STORES` (`1`/`0`, `on`/`off`, unset: on); called
/// when the settings are checked and when a DSM is made.
pub(crate) fn configure() -> Result<(), crate::DsmError> {
    let on = match std::env::var("HYFI_PLAIN_STORES") {
        Err(_) => true,
        Ok(v) => match v.trim() {
            "1" | "on" | "true" | "yes" => true,
            "0" | "off" | "false" | "no" => false,
            _ => {
                return Err(crate::DsmError::BadEnv {
                    var: "HYFI_PLAIN_STORES",
                    value: v,
                    expected: "1 or 0 (plain-store write views on or off; unset means on)",
                })
            }
        },
    };
    ENABLED.store(on, Relaxed);
    Ok(())
}

/// The filthread running now, unique on the node: filthread numbers are
/// per processor, so the processor goes in the high bits (0 off a
/// processor).
pub(crate) fn filthread() -> u64 {
    match hyfi_core::filthread::current_processor() {
        Some(p) => (p as u64 + 1) << 40 | hyfi_core::trace::filthread(),
        None => 0,
    }
}

/// Whether plain-store views may be handed out at all.
#[inline]
pub(crate) fn enabled() -> bool {
    ENABLED.load(Relaxed)
}

/// One view's footprint in a `PLAIN` or `VIEWS` epoch.
struct Claim {
    /// Elements from the first of its first row to the last of its last.
    span: Range<usize>,
    /// What took it: the chunk of an iterative phase, or the filthread
    /// (`hyfi_core::filthread::current_work`).
    ft: u64,
}

/// An array's claims in one epoch, ordered by their first element, and
/// found by overlap in `O(log n)` while they are pairwise disjoint (the
/// clean case: every chunk of a phase claims its own rows; a node of 16
/// processors with 8 chunks each makes 128 claims per array and phase,
/// and a list searched whole for each made that quadratic, under the
/// array's lock).
#[derive(Default)]
struct Claims {
    /// By (first element, order of arrival): claims may share a start.
    by_start: BTreeMap<(usize, usize), Claim>,
    /// Some two claims overlap: a query looks at every claim.
    overlapping: bool,
}

impl Claims {
    /// Whether some claim overlapping `span` satisfies `f`.
    fn any_hit(&self, span: &Range<usize>, mut f: impl FnMut(&Claim) -> bool) -> bool {
        let hits = |c: &Claim| c.span.start < span.end && span.start < c.span.end;
        if self.overlapping {
            return self.by_start.values().any(|c| hits(c) && f(c));
        }
        // Pairwise disjoint claims sorted by start are sorted by end too:
        // the ones overlapping `span` are the last ones starting before its
        // end, back to the first that ends at or before its start.
        for c in self.by_start.range(..(span.end, 0)).rev().map(|(_, c)| c) {
            if c.span.end <= span.start {
                return false;
            }
            if hits(c) && f(c) {
                return true;
            }
        }
        false
    }

    fn push(&mut self, c: Claim) {
        if !self.overlapping && self.any_hit(&c.span, |_| true) {
            self.overlapping = true;
        }
        let n = self.by_start.len();
        self.by_start.insert((c.span.start, n), c);
    }

    fn clear(&mut self) {
        self.by_start.clear();
        self.overlapping = false;
    }
}

/// An array's claims in the current access epoch, and what its views'
/// call sites did last time.
#[derive(Default)]
struct Table {
    claims: Claims,
    /// Checked accesses in a `PLAIN` epoch: a view taken after one must
    /// not cover it either (the access and the view's stores would not be
    /// ordered).
    checked: Vec<Claim>,
    /// The span of the checked accesses past [`MAX_CHECKED`].
    checked_rest: Option<Range<usize>>,
    /// Call sites that took write views of the array in this epoch.
    sites: Vec<Site>,
    /// A checked access or overlapping view in a `PLAIN` epoch (the word
    /// stays `PLAIN`, the epoch is not clean).
    unclean: bool,
    /// Per call site: what its last epoch showed.
    history: Vec<(Site, History)>,
}

/// What a call site's last epoch of write views showed.
struct History {
    /// The epoch was clean: pairwise disjoint views, no checked access.
    clean: bool,
    /// Its views' spans, sorted (kept only when clean).
    spans: Vec<Range<usize>>,
    /// It was clean, and so was the site's epoch before it, whose views
    /// covered all of its views' footprints: the phase's footprints repeat
    /// (or shrink, as a factorization's trailing rows do), and the next
    /// epoch stores plainly.
    steady: bool,
}

/// Whether every span of `inner` lies inside some span of `outer` (both
/// sorted by start and pairwise disjoint).
fn covered(inner: &[Range<usize>], outer: &[Range<usize>]) -> bool {
    let mut o = outer.iter().peekable();
    inner.iter().all(|s| {
        while o.next_if(|r| r.end <= s.start).is_some() {}
        o.peek()
            .is_some_and(|r| r.start <= s.start && s.end <= r.end)
    })
}

/// Call sites (per phase) whose history an array keeps at most.
const MAX_HISTORY: usize = 1024;

/// Checked accesses recorded per epoch at most. A phase that makes more
/// in a plain epoch has changed its access pattern wholesale; the rest are
/// kept as one span that no view may cover.
const MAX_CHECKED: usize = 4096;

/// Per array: the plain-store bookkeeping (locked only when views are
/// taken, at the epoch's end, and on checked accesses' slow path).
#[derive(Default)]
pub(crate) struct PlainState {
    table: Mutex<Table>,
    /// The site noted last this epoch ([`site_key`]; 0: none), tested
    /// without the lock by [`PlainState::note_site`].
    noted: AtomicU64,
    /// In this `PLAIN` epoch some path besides a chunk's own view may reach
    /// its claim: two views of one chunk overlap, or a checked access was
    /// made. A row is then lent by copy, not as the shared bytes
    /// (see [`Loan`]).
    shared_paths: AtomicBool,
}

/// A site as one number, for [`PlainState::note_site`]'s test without the
/// lock (0: none).
fn site_key(site: Site) -> u64 {
    (site.0 as *const Location<'static> as u64) ^ site.1.rotate_left(32) | 1
}

/// What [`PlainState::claim_view`] found.
pub(crate) enum Outcome {
    /// The view stores plainly.
    Plain,
    /// The view stores atomically; `clean` says whether the epoch stays
    /// clean (no overlap).
    Atomic { clean: bool },
    /// The span overlaps a claim of another chunk or filthread in a `PLAIN` epoch.
    Conflict,
    /// The span overlaps elements the running filthread lends ([`Loan`]).
    Lent,
}

/// Why [`PlainState::checked_access`] refuses an access.
pub(crate) enum Refused {
    /// It falls inside another filthread's claim (a race with its plain
    /// stores).
    Conflict,
    /// It falls inside elements the running filthread lends ([`Loan`]).
    Lent,
}

impl PlainState {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether views from `site` may store plainly this epoch: the last
    /// two epochs in which that site's views wrote the array were clean,
    /// the later one's footprints inside the earlier one's. One clean
    /// epoch does not predict the
    /// next: a wavefront's phase takes one view in its first execution
    /// and, in its second, two that overlap (a tile and the one below it,
    /// whose view covers the first's last row as its halo).
    pub(crate) fn site_is_steady(&self, site: Site) -> bool {
        let t = self.lock();
        t.history.iter().any(|(s, h)| same(*s, site) && h.steady)
    }

    /// Records a write view of `span` taken by chunk or filthread `ft` at `site`,
    /// in an epoch whose word is `PLAIN` (`plain`) or `VIEWS`.
    pub(crate) fn claim_view(
        &self,
        span: Range<usize>,
        ft: u64,
        site: Site,
        plain: bool,
    ) -> Outcome {
        if plain && lent_here(self, &span) {
            return Outcome::Lent;
        }
        let mut t = self.lock();
        if !t.sites.iter().any(|&s| same(s, site)) {
            t.sites.push(site);
        }
        let hits = |c: &Claim| c.span.start < span.end && span.start < c.span.end;
        let overlap = t.claims.any_hit(&span, |c| !plain || c.ft != ft);
        if plain && t.claims.any_hit(&span, |c| c.ft == ft) {
            // Harmless for plain stores (one chunk's accesses are ordered),
            // but the chunk's rows may no longer be lent as `&mut [T]`.
            self.shared_paths.store(true, Relaxed);
        }
        let after_checked = t.checked.iter().any(|c| hits(c) && c.ft != ft)
            || t.checked_rest
                .as_ref()
                .is_some_and(|r| r.start < span.end && span.start < r.end);
        if plain && (overlap || after_checked) {
            t.unclean = true;
            return Outcome::Conflict;
        }
        t.claims.push(Claim { span, ft });
        if plain {
            Outcome::Plain
        } else {
            Outcome::Atomic { clean: !overlap }
        }
    }

    /// A checked access of elements `span` by chunk or filthread `ft` in a `PLAIN`
    /// epoch: marks the epoch not clean, or says why it is refused.
    pub(crate) fn checked_access(&self, span: Range<usize>, ft: u64) -> Option<Refused> {
        if lent_here(self, &span) {
            return Some(Refused::Lent);
        }
        let mut t = self.lock();
        t.unclean = true;
        self.shared_paths.store(true, Relaxed);
        let hit = t.claims.any_hit(&span, |c| c.ft != ft);
        if !hit {
            if t.checked.len() < MAX_CHECKED {
                t.checked.push(Claim { span, ft });
            } else {
                // Beyond the cap, one span covers the rest, owned by no
                // filthread (every view over it conflicts).
                let all = match t.checked_rest.take() {
                    Some(r) => r.start.min(span.start)..r.end.max(span.end),
                    None => span,
                };
                t.checked_rest = Some(all);
            }
        }
        hit.then_some(Refused::Conflict)
    }

    /// Notes a call site whose view came in an epoch already `WRITTEN`
    /// (not clean): its history becomes not clean at the epoch's end.
    ///
    /// Red-black SOR binds a view per row and colour, so this runs per
    /// segment: the site noted last is tested without the lock (locking
    /// and searching each time cost such a phase 5 %).
    pub(crate) fn note_site(&self, site: Site) {
        let key = site_key(site);
        if self.noted.load(Relaxed) == key {
            return;
        }
        let mut t = self.lock();
        if !t.sites.iter().any(|&s| same(s, site)) {
            t.sites.push(site);
        }
        self.noted.store(key, Relaxed);
    }

    /// At the end of an access epoch (no filament runs): records for every
    /// call site of the epoch whether it was `clean` and whether its
    /// footprints repeated the site's last epoch's, and forgets the
    /// epoch's claims.
    pub(crate) fn end_epoch(&self, clean: bool) {
        let mut t = self.lock();
        let clean = clean && !t.unclean;
        let spans: Vec<Range<usize>> = if clean {
            // Disjoint, so ordered by start alone.
            t.claims.by_start.values().map(|c| c.span.clone()).collect()
        } else {
            Vec::new()
        };
        let sites = std::mem::take(&mut t.sites);
        for site in sites {
            match t.history.iter_mut().find(|(s, _)| same(*s, site)) {
                Some((_, h)) => {
                    h.steady = clean && h.clean && covered(&spans, &h.spans);
                    h.clean = clean;
                    h.spans.clone_from(&spans);
                }
                None => {
                    if t.history.len() >= MAX_HISTORY {
                        // A program made anew for every start (a `Program`
                        // per time step) brings new sites each time: the
                        // oldest entry goes, at worst two atomic executions
                        // again for a site still in use.
                        t.history.remove(0);
                    }
                    t.history.push((
                        site,
                        History {
                            clean,
                            spans: spans.clone(),
                            steady: false,
                        },
                    ));
                }
            }
        }
        t.claims.clear();
        self.noted.store(0, Relaxed);
        t.checked.clear();
        t.checked_rest = None;
        t.unclean = false;
        self.shared_paths.store(false, Relaxed);
    }

    /// Whether a plain view's row may be lent as the shared bytes
    /// themselves ([`Loan`]): no other path to a chunk's claim was made in
    /// this epoch.
    #[inline(always)]
    pub(crate) fn lendable(&self) -> bool {
        !self.shared_paths.load(Relaxed)
    }
}

/// Elements of a plain-store view lent to a closure as `&mut [T]`
/// (`WriteRows::with_row`, `WriteRange::with_slice`), for as long as the
/// loan lives.
///
/// **Why a `&mut [T]` into shared bytes is sound here.** The compiler may
/// assume that nothing but the `&mut` reads or writes its elements while it
/// lives, on this thread as on others. Other threads: the elements lie in
/// the view's claim in a `PLAIN` epoch, which no other chunk's view or
/// checked access may overlap (those panic, above), and the page server
/// copies no page a live plain view covers (core/plain.rs). This thread,
/// other paths that existed before the loan: the view itself is borrowed
/// mutably by the loan; another view of the same chunk overlapping the
/// claim, or a checked access (which may have handed out a `ViewMut` that
/// writes without further checks), sets [`PlainState::lendable`] false for
/// the epoch, and the row is then lent by copy. Paths made while the loan
/// lives: a checked access or a new write view of lent elements by the
/// same filthread panics (`PlainState::checked_access` and `claim_view`,
/// which judge loans as they judge claims, on the slow paths every
/// such access takes in a `PLAIN` epoch). Loans are kept per thread and
/// tagged with the filthread, which resumes on the thread it suspended on,
/// so a filthread that suspends inside the closure keeps its loan and
/// another filthread of the processor is not judged by it. The page
/// server: it copies no page an active plain view covers, and a filthread
/// that waits for a page while it lends keeps its views active through
/// the wait (core/plain.rs, `park_plain`), so the lent bytes are not read
/// even while the closure holding them is suspended.
pub(crate) struct Loan {
    record: LoanRecord,
}

/// A loan: the array's state (as its key), the running filthread, the
/// elements lent, and whether they are the shared elements themselves (a
/// copy's loan only makes other paths to them panic, as the shared
/// elements' does).
type LoanRecord = (usize, u64, Range<usize>, bool);

thread_local! {
    /// The loans of the filthreads of this thread (usually none or one).
    static LOANS: RefCell<Vec<LoanRecord>> = const { RefCell::new(Vec::new()) };
}

impl Loan {
    /// Lends elements `span` of the array whose state is `state`: the
    /// shared elements themselves (`direct`) or a copy of them.
    #[inline]
    pub(crate) fn new(state: &PlainState, span: Range<usize>, direct: bool) -> Loan {
        let record = (
            state as *const PlainState as usize,
            filthread(),
            span,
            direct,
        );
        LOANS.with(|l| l.borrow_mut().push(record.clone()));
        Loan { record }
    }
}

impl Drop for Loan {
    /// Ends the loan (also when the closure panics). Loans of one
    /// filthread end in the reverse order they began, but another
    /// filthread of the thread may end its own in between: the record is
    /// found whole and removed in place, so the others keep their order.
    #[inline]
    fn drop(&mut self) {
        LOANS.with(|l| {
            let mut l = l.borrow_mut();
            if let Some(k) = l.iter().rposition(|r| *r == self.record) {
                l.remove(k);
            }
        });
    }
}

/// Whether the running filthread lends shared elements themselves now
/// (a copy's loan needs no view kept active: nothing shared is lent).
pub(crate) fn holds_loan() -> bool {
    LOANS.with(|l| {
        let l = l.borrow();
        !l.is_empty() && {
            let ft = filthread();
            l.iter().any(|(_, f, _, direct)| *f == ft && *direct)
        }
    })
}

/// Whether the running filthread has lent elements of `span` of the array
/// whose state is `state`.
fn lent_here(state: &PlainState, span: &Range<usize>) -> bool {
    let key = state as *const PlainState as usize;
    LOANS.with(|l| {
        let l = l.borrow();
        if l.is_empty() {
            return false;
        }
        let ft = filthread();
        l.iter()
            .any(|(k, f, s, _)| *k == key && *f == ft && s.start < span.end && span.start < s.end)
    })
}

#[cold]
#[inline(never)]
pub(crate) fn lent(seq: u64, what: &str, e: usize) -> ! {
    panic!(
        "hyfi-dsm: {what} element {e} of shared array #{seq}, which this filament holds as a \
         `&mut` slice (WriteRows::with_row or WriteRange::with_slice) at this moment. Inside \
         the closure, read and write those elements through the slice it was given"
    )
}

/// Two sites are the same place in the source, in the same phase.
fn same(a: Site, b: Site) -> bool {
    let (x, y) = (a.0, b.0);
    a.1 == b.1
        && (std::ptr::eq(x, y)
            || (x.line() == y.line() && x.column() == y.column() && x.file() == y.file()))
}

#[cold]
#[inline(never)]
pub(crate) fn conflict(seq: u64, what: &str, e: usize) -> ! {
    panic!(
        "hyfi-dsm: {what} element {e} of shared array #{seq}, inside the footprint of another \
         filament's plain-store write view in this phase. The phase's previous two executions \
         wrote the array only through the same disjoint write views, so this one stores plainly \
         (not atomically), and the access would race with those stores: the phase's access \
         pattern changed between iterations. Access the element through the view that covers it, or \
         turn plain-store views off with HYFI_PLAIN_STORES=0"
    )
}

#[cfg(test)]
mod tests {
    use super::covered;

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // lists of one span, meant
    fn footprints_covered_by_the_epoch_before() {
        let outer = [0..10, 20..30, 40..50];
        // The same views, fewer, and smaller ones.
        assert!(covered(&outer, &outer));
        assert!(covered(&[20..30], &outer));
        assert!(covered(&[2..10, 25..30, 40..41], &outer));
        assert!(covered(&[], &outer));
        // A view that grew, moved, or is new.
        assert!(!covered(&[0..11], &outer));
        assert!(!covered(&[10..20], &outer));
        assert!(!covered(&[0..10, 20..30, 40..50, 60..70], &outer));
        assert!(!covered(&[5..25], &outer));
        assert!(!covered(&[0..1], &[]));
    }
}
