//! The nodes' output, copied to the launcher's with a `[node i] ` prefix,
//! and kept in proportion when many nodes say the same thing.
//!
//! With thousands of nodes, one failure makes every node report it: node 0
//! times out and sends each peer its list of missing ranks, and each peer
//! prints that list — N lines of N numbers, gigabytes. So each stderr line is
//! rewritten and counted before it is copied:
//!
//! - a list of ascending numbers (`1, 2, 3, …, 99, 999`) is written as ranges
//!   (`1-99, 999`), and a line is cut at [`MAX_LINE`] bytes;
//! - a line that [`REPEATS_SHOWN`] nodes already wrote (the same text, up to
//!   each node's own rank) is not copied again but counted; `Stderr::summary`
//!   prints it once at the end with the count and the ranks that wrote it.
//!
//! Stdout is the program's result and is copied as it is.
//!
//! Progress lines on stderr (`hyfi_core::progress::LINE_PREFIX`) are never
//! copied: they go to the job's `Status` line. Every line copied goes
//! through `Status::print`, which erases the status line first.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;

use hyfi_core::progress::parse_line;

use super::status::Status;

/// Longest stderr line copied, in bytes; the rest is cut (and counted).
pub const MAX_LINE: usize = 2000;

/// How many nodes' copies of the same stderr line are shown before the rest
/// are only counted: enough that a small job loses nothing.
pub const REPEATS_SHOWN: usize = 8;

/// Distinct stderr lines remembered for the summary; lines beyond are
/// copied as they are, so memory stays bounded whatever the nodes write.
const MAX_REMEMBERED: usize = 10_000;

/// Stack of a forwarding thread: it holds a line buffer on the heap and
/// little else, and a launcher of thousands of nodes runs two per node.
const FORWARDER_STACK: usize = 128 * 1024;

/// The stderr lines seen so far, shared by every node's forwarder.
#[derive(Default)]
pub(crate) struct Stderr {
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    /// Line (with `<rank>` for the writer's rank) → the nodes that wrote it.
    lines: HashMap<String, Writers>,
    /// Keys in the order first seen, for the summary.
    order: Vec<String>,
}

#[derive(Default)]
struct Writers {
    shown: usize,
    /// Ranks whose copy was held back (a rank appears once per copy).
    held: Vec<usize>,
}

impl Stderr {
    /// Whether node `rank`'s line (already compressed) should be copied
    /// now; if not, it is counted for the summary.
    fn admit(&self, rank: usize, line: &str) -> bool {
        let key = mask_rank(line, rank);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = seen.lines.get_mut(&key) {
            if w.shown < REPEATS_SHOWN {
                w.shown += 1;
                return true;
            }
            w.held.push(rank);
            return false;
        }
        if seen.lines.len() < MAX_REMEMBERED {
            seen.order.push(key.clone());
            seen.lines.insert(
                key,
                Writers {
                    shown: 1,
                    held: Vec::new(),
                },
            );
        }
        true
    }

    /// One line per held-back line: how many more nodes wrote it, and which.
    pub(crate) fn summary(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for key in &seen.order {
            let w = &seen.lines[key];
            if w.held.is_empty() {
                continue;
            }
            let mut ranks = w.held.clone();
            ranks.sort_unstable();
            ranks.dedup();
            out.push(format!(
                "hyfi launcher: {} more line(s) like this from node(s) {} (<rank> is each \
                 node's own): {key}",
                w.held.len(),
                ranges(&ranks)
            ));
        }
        out
    }
}

/// Starts the thread that copies `pipe` to our stdout (`stderr: None`) or
/// stderr line by line with the node's prefix, and hands progress lines
/// on stderr to `status`; it sends on `done` at end of file. Returns the
/// number of threads started (0 or 1).
pub(crate) fn forward(
    rank: usize,
    pipe: impl Read + Send + 'static,
    stderr: Option<Arc<Stderr>>,
    status: Arc<Status>,
    done: mpsc::Sender<()>,
) -> usize {
    let spawned = thread::Builder::new()
        .name(format!("hyfi-launch-out{rank}"))
        .stack_size(FORWARDER_STACK)
        .spawn(move || {
            let prefix = format!("[node {rank}] ");
            let mut reader = BufReader::new(pipe);
            let mut line = Vec::new();
            let mut out = prefix.clone().into_bytes();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if line.ends_with(b"\n") {
                    line.pop();
                }
                out.truncate(prefix.len());
                match &stderr {
                    None => out.extend_from_slice(&line),
                    Some(seen) => {
                        if let Some(report) = std::str::from_utf8(&line).ok().and_then(parse_line) {
                            status.update(rank, report);
                            continue;
                        }
                        let text = shorten(&compress_lists(&String::from_utf8_lossy(&line)));
                        if !seen.admit(rank, &text) {
                            continue;
                        }
                        out.extend_from_slice(text.as_bytes());
                    }
                }
                out.push(b'\n');
                // One write_all under the lock: lines never interleave. A
                // closed stdout is no reason to stop draining the node
                // (it would block on a full pipe), so errors are dropped.
                status.print(|| {
                    if stderr.is_some() {
                        let _ = std::io::stderr().lock().write_all(&out);
                    } else {
                        let mut o = std::io::stdout().lock();
                        let _ = o.write_all(&out).and_then(|()| o.flush());
                    }
                });
            }
            let _ = done.send(());
        });
    usize::from(spawned.is_ok())
}

/// `ranks` (sorted, distinct) as ranges: `[1, 2, 3, 7]` → `1-3, 7`.
pub fn ranges(ranks: &[usize]) -> String {
    let mut s = String::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        if !s.is_empty() {
            s.push_str(", ");
        }
        match j - i {
            0 => write!(s, "{}", ranks[i]),
            1 => write!(s, "{}, {}", ranks[i], ranks[j]),
            _ => write!(s, "{}-{}", ranks[i], ranks[j]),
        }
        .expect("writing to a String");
        i = j + 1;
    }
    s
}

/// Rewrites each list of three or more strictly ascending numbers
/// separated by `", "` as [`ranges`]; other text is left as it is.
fn compress_lists(line: &str) -> String {
    let b = line.as_bytes();
    let mut out = String::with_capacity(line.len());
    let mut copied = 0; // bytes of `line` already in `out`
    let mut i = 0;
    while i < b.len() {
        // Not inside a word or a decimal number ("v2", "1.5").
        let starts_word = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'.');
        if !(b[i].is_ascii_digit() && starts_word) {
            i += 1;
            continue;
        }
        // Numbers of the list starting at i, and where it ends.
        let mut nums = Vec::new();
        let mut end = i;
        let mut at = i;
        while let Some((n, after)) = number_at(b, at) {
            if nums.last().is_some_and(|&last| n <= last) {
                break;
            }
            nums.push(n);
            end = after;
            if b[after..].starts_with(b", ") {
                at = after + 2;
            } else {
                break;
            }
        }
        if nums.len() >= 3 {
            out.push_str(&line[copied..i]);
            out.push_str(&ranges(&nums));
            copied = end;
        }
        i = end.max(i + 1);
    }
    out.push_str(&line[copied..]);
    out
}

/// The number at `b[at..]` and the index after it, if a whole word.
fn number_at(b: &[u8], at: usize) -> Option<(usize, usize)> {
    let len = b[at..].iter().take_while(|c| c.is_ascii_digit()).count();
    let after = at + len;
    if len == 0 || b.get(after).is_some_and(u8::is_ascii_alphanumeric) {
        return None;
    }
    std::str::from_utf8(&b[at..after])
        .ok()?
        .parse()
        .ok()
        .map(|n| (n, after))
}

/// `line` cut at [`MAX_LINE`] bytes (on a character boundary).
fn shorten(line: &str) -> String {
    if line.len() <= MAX_LINE {
        return line.to_owned();
    }
    let mut cut = MAX_LINE;
    while !line.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{} [… {} more bytes]", &line[..cut], line.len() - cut)
}

/// `line` with each whole-word occurrence of `rank` written `<rank>`, so
/// that "node 3: lost node 0" from node 3 and "node 4: lost node 0" from
/// node 4 count as the same line.
fn mask_rank(line: &str, rank: usize) -> String {
    let r = rank.to_string();
    let b = line.as_bytes();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    let mut copied = 0;
    while let Some(off) = line[i..].find(&r) {
        let at = i + off;
        let after = at + r.len();
        let alone = (at == 0 || !b[at - 1].is_ascii_digit())
            && !b.get(after).is_some_and(u8::is_ascii_digit);
        if alone {
            out.push_str(&line[copied..at]);
            out.push_str("<rank>");
            copied = after;
        }
        i = after;
    }
    out.push_str(&line[copied..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_compress_runs() {
        assert_eq!(ranges(&[]), "");
        assert_eq!(ranges(&[5]), "5");
        assert_eq!(ranges(&[1, 2]), "1, 2");
        assert_eq!(ranges(&[2, 3, 4, 5, 99, 999]), "2-5, 99, 999");
        let all: Vec<usize> = (2..=99_999).collect();
        assert_eq!(ranges(&all), "2-99999");
    }

    #[test]
    fn lists_in_lines_become_ranges() {
        let missing: Vec<String> = (1..3000).map(|r| r.to_string()).collect();
        let line = format!(
            "only 1 of 3000 nodes arrived (missing: {}); check",
            missing.join(", ")
        );
        assert_eq!(
            compress_lists(&line),
            "only 1 of 3000 nodes arrived (missing: 1-2999); check"
        );
        // Not ascending, too short, or part of a word: left alone.
        for s in ["a 3, 2, 1 b", "1, 2 then", "x1, 2, 3", "v1.2, 3"] {
            assert_eq!(compress_lists(s), s);
        }
        assert_eq!(compress_lists("v1.2, 3, 4, 5"), "v1.2, 3-5");
        // Ascending but not consecutive: kept as a list.
        assert_eq!(compress_lists("10, 20, 30"), "10, 20, 30");
    }

    #[test]
    fn long_lines_are_cut() {
        let s = "é".repeat(MAX_LINE);
        let cut = shorten(&s);
        assert!(cut.len() < MAX_LINE + 40, "{}", cut.len());
        assert!(cut.ends_with(&format!("[… {} more bytes]", MAX_LINE)));
    }

    #[test]
    fn each_nodes_own_rank_is_masked() {
        assert_eq!(
            mask_rank("node 3: lost node 0", 3),
            "node <rank>: lost node 0"
        );
        assert_eq!(mask_rank("node 13: 3 of 31", 3), "node 13: <rank> of 31");
    }

    #[test]
    fn many_nodes_saying_the_same_are_summarised() {
        let s = Stderr::default();
        let shown = (0..1000)
            .filter(|&r| s.admit(r, &format!("node {r}: refused: missing 1000-2999")))
            .count();
        assert_eq!(shown, REPEATS_SHOWN);
        // A line of its own is always shown.
        assert!(s.admit(5, "node 5: something else"));
        let sum = s.summary();
        assert_eq!(sum.len(), 1, "{sum:?}");
        assert!(
            sum[0].contains(&format!("{} more line(s)", 1000 - REPEATS_SHOWN))
                && sum[0].contains(&format!("node(s) {}-999", REPEATS_SHOWN))
                && sum[0].ends_with("node <rank>: refused: missing 1000-2999"),
            "{sum:?}"
        );
    }
}
