//! The Chrome trace event format, as hyfi writes it, and the merge of the
//! nodes' files into one.
//!
//! A node's file is a complete JSON object (it opens alone in Perfetto)
//! with one event per line between a first line and a `],` line, and its
//! [`Summary`] in `otherData`:
//!
//! ```text
//! {"displayTimeUnit":"ns","traceEvents":[
//! {"name":"process_name","ph":"M","pid":0,"tid":0,"args":{"name":"node 0"}},
//! {"name":"pool 0","ph":"X","ts":1234.567,"dur":8.250,"pid":0,"tid":0,"args":{…}},
//! …
//! {"name":"hyfi","ph":"M","pid":0,"tid":0,"args":{}}
//! ],
//! "otherData":{"hyfi_summary_node0":"node=0 procs=2 …"}}
//! ```
//!
//! so that [`merge`] joins files line by line, never holding a whole
//! trace in memory, and reads the summaries back without a JSON parser.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use super::summary::{self, Summary};
use super::{Event, Kind};

const HEAD: &str = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[";
const TAIL: &str = "],";
const SUMMARY_KEY: &str = "\"hyfi_summary_node";

/// Microseconds with three decimals, from nanoseconds.
fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

fn event_line(out: &mut String, node: usize, tid: u32, offset: i64, seq: &mut u64, e: &Event) {
    let ts = us((e.t as i64 + offset).max(0) as u64);
    let a = e.args;
    let common = |out: &mut String, name: &str, ph: &str| {
        let _ = write!(
            out,
            "{{\"name\":\"{name}\",\"ph\":\"{ph}\",\"ts\":{ts},\"pid\":{node},\"tid\":{tid}"
        );
    };
    let complete = |out: &mut String, name: &str, args: String| {
        common(out, name, "X");
        let _ = writeln!(out, ",\"dur\":{},\"args\":{{{args}}}}},", us(e.dur));
    };
    let inst = |out: &mut String, name: &str, args: String| {
        common(out, name, "i");
        let _ = writeln!(out, ",\"s\":\"t\",\"args\":{{{args}}}}},");
    };
    // Waits of suspended filthreads overlap the segments that run
    // meanwhile on the same processor: async events, drawn on tracks of
    // their own under the processor's node.
    let mut asynchronous = |out: &mut String, name: &str, cat: &str, args: String| {
        *seq += 1;
        let id = format!("0x{:x}", ((node as u64) << 40) | *seq);
        let end = us((e.t as i64 + offset).max(0) as u64 + e.dur);
        let _ = writeln!(
            out,
            "{{\"name\":\"{name}\",\"cat\":\"{cat}\",\"ph\":\"b\",\"id\":\"{id}\",\"ts\":{ts},\
             \"pid\":{node},\"tid\":{tid},\"args\":{{{args}}}}},"
        );
        let _ = writeln!(
            out,
            "{{\"name\":\"{name}\",\"cat\":\"{cat}\",\"ph\":\"e\",\"id\":\"{id}\",\"ts\":{end},\
             \"pid\":{node},\"tid\":{tid}}},"
        );
    };
    match e.kind {
        Kind::Phase => complete(
            out,
            &format!("phase {}", a[0]),
            format!("\"phase\":{},\"iteration\":{}", a[0], a[1]),
        ),
        Kind::Segment => {
            let name = if a[3] & 4 != 0 {
                "filthread".to_string()
            } else {
                format!("pool {}", a[0])
            };
            complete(
                out,
                &name,
                format!(
                    "\"pool\":{},\"filaments\":{},\"filthread\":{},\"resumed\":{},\"suspended\":{}",
                    a[0],
                    a[1],
                    a[2],
                    a[3] & 1 != 0,
                    a[3] & 2 != 0
                ),
            )
        }
        Kind::PageWait => asynchronous(
            out,
            "page wait",
            "page",
            format!(
                "\"allocation\":{},\"page\":{},\"pages\":{},\"home\":{},\"filthread\":{}",
                a[0],
                a[1],
                a[2] & 0xffff_ffff,
                a[2] >> 32,
                a[3]
            ),
        ),
        Kind::JoinWait => asynchronous(out, "join wait", "join", format!("\"filthread\":{}", a[0])),
        Kind::Barrier => complete(out, "barrier", format!("\"phase\":{}", a[0])),
        Kind::Release => complete(out, "release", format!("\"phase\":{}", a[0])),
        Kind::PostPhase => complete(out, "post-phase", format!("\"phase\":{}", a[0])),
        Kind::Idle => complete(out, "idle", String::new()),
        Kind::Steal => inst(
            out,
            "steal",
            format!(
                "\"thief\":{},\"donor\":{},\"filaments\":{},\"latent\":{}",
                a[0], a[1], a[2], a[3]
            ),
        ),
        Kind::RemoteSteal => complete(
            out,
            "remote steal",
            format!("\"donor_node\":{},\"filaments\":{}", a[0], a[1]),
        ),
        Kind::StealServed => inst(
            out,
            "steal served",
            format!(
                "\"thief_node\":{},\"filaments\":{},\"by_processor\":{}",
                a[0],
                a[1],
                a[2] != 0
            ),
        ),
        Kind::RemoteRun => inst(out, "remote filament", format!("\"from_node\":{}", a[0])),
        Kind::Send | Kind::Recv => {
            let (name, peer) = if e.kind == Kind::Send {
                ("send", "to")
            } else {
                ("recv", "from")
            };
            let class = if a[1] == 0 { "control" } else { "bulk" };
            inst(
                out,
                name,
                format!(
                    "\"{peer}\":{},\"class\":\"{class}\",\"bytes\":{}",
                    a[0], a[2]
                ),
            )
        }
        Kind::PagesIn => inst(
            out,
            "pages in",
            format!("\"home\":{},\"pages\":{}", a[0], a[1]),
        ),
    }
}

fn escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            '"' => vec!['\\', '"'],
            '\\' => vec!['\\', '\\'],
            c if (c as u32) < 0x20 => vec![' '],
            c => vec![c],
        })
        .collect()
}

/// `path` with `suffix` appended to its last component (written whole,
/// then renamed: a reader never sees half a trace).
pub(super) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

/// Writes one node's events (clocks shifted by `offset`) to `file`.
pub(super) fn write_node(
    file: &Path,
    node: usize,
    nodes: usize,
    offset: i64,
    tracks: &[(u32, &str, &[Event])],
    summary: &Summary,
) -> std::io::Result<()> {
    let tmp = with_suffix(file, ".tmp");
    let mut w = BufWriter::new(File::create(&tmp)?);
    writeln!(w, "{HEAD}")?;
    writeln!(
        w,
        "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{node},\"tid\":0,\"args\":{{\"name\":\"node {node} of {nodes}\"}}}},"
    )?;
    writeln!(
        w,
        "{{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":{node},\"tid\":0,\"args\":{{\"sort_index\":{node}}}}},"
    )?;
    let mut seq = 0u64;
    let mut line = String::new();
    for &(tid, name, events) in tracks {
        writeln!(
            w,
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{node},\"tid\":{tid},\"args\":{{\"name\":\"{}\"}}}},",
            escape(name)
        )?;
        writeln!(
            w,
            "{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":{node},\"tid\":{tid},\"args\":{{\"sort_index\":{tid}}}}},"
        )?;
        for e in events {
            line.clear();
            event_line(&mut line, node, tid, offset, &mut seq, e);
            w.write_all(line.as_bytes())?;
        }
    }
    // The last event carries no comma after it.
    writeln!(
        w,
        "{{\"name\":\"hyfi\",\"ph\":\"M\",\"pid\":{node},\"tid\":0,\"args\":{{\"dropped\":{}}}}}",
        summary.dropped
    )?;
    writeln!(w, "{TAIL}")?;
    writeln!(
        w,
        "\"otherData\":{{{SUMMARY_KEY}{node}\":\"{}\"}}}}",
        summary.encode()
    )?;
    w.flush()?;
    drop(w);
    std::fs::rename(&tmp, file)
}

/// What [`merge`] made.
#[derive(Debug)]
pub struct Merged {
    /// The merged trace.
    pub path: PathBuf,
    /// Each node's summary, by node (the nodes whose files were found).
    pub summaries: Vec<Summary>,
    /// Nodes whose file was missing (a node that died before writing it).
    pub missing: Vec<usize>,
    /// Size of the merged file (bytes).
    pub bytes: u64,
}

impl std::fmt::Display for Merged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&summary::table(&self.path, &self.summaries))?;
        if !self.missing.is_empty() {
            writeln!(
                f,
                "hyfi trace: no file from node(s) {:?} (they ended before writing it): the timeline lacks them",
                self.missing
            )?;
        }
        Ok(())
    }
}

/// Merges the files `path.node0` … `path.node<nodes-1>` into `path` and
/// removes them. A missing file is reported in [`Merged::missing`]; the
/// others are merged all the same. With `nodes` `None`, every
/// `path.node<i>` that exists is merged.
pub fn merge(path: &Path, nodes: Option<usize>) -> std::io::Result<Merged> {
    let nodes = match nodes {
        Some(n) => n,
        None => {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let stem = path
                .file_name()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_default();
            let mut most = 0usize;
            for e in std::fs::read_dir(&dir)? {
                let name = e?.file_name().to_string_lossy().to_string();
                if let Some(i) = name
                    .strip_prefix(&stem)
                    .and_then(|r| r.strip_prefix(".node"))
                    .and_then(|r| r.parse::<usize>().ok())
                {
                    most = most.max(i + 1);
                }
            }
            if most == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!(
                        "no node's trace {}.node<i> found: was the job run with HYFI_TRACE={}?",
                        path.display(),
                        path.display()
                    ),
                ));
            }
            most
        }
    };
    let tmp = with_suffix(path, ".tmp");
    let mut w = BufWriter::new(File::create(&tmp)?);
    writeln!(w, "{HEAD}")?;
    let mut summaries = Vec::new();
    let mut missing = Vec::new();
    let mut parts = Vec::new();
    let mut first = true;
    for node in 0..nodes {
        let part = super::node_file(path, node);
        let Ok(f) = File::open(&part) else {
            missing.push(node);
            continue;
        };
        parts.push(part);
        let mut in_events = false;
        for line in BufReader::new(f).lines() {
            let line = line?;
            if line == HEAD {
                in_events = true;
                continue;
            }
            if line == TAIL {
                in_events = false;
                continue;
            }
            if in_events {
                // Every line but the last of a part ends with a comma;
                // the parts are joined with one.
                let ev = line.strip_suffix(',').unwrap_or(&line);
                if !first {
                    w.write_all(b",\n")?;
                }
                w.write_all(ev.as_bytes())?;
                first = false;
            } else if let Some(rest) = line.find(SUMMARY_KEY).map(|i| &line[i..]) {
                if let Some(s) = rest
                    .split_once(":\"")
                    .and_then(|(_, v)| v.split('"').next())
                    .and_then(Summary::decode)
                {
                    summaries.push(s);
                }
            }
        }
    }
    writeln!(w)?;
    writeln!(w, "{TAIL}")?;
    let other: Vec<String> = summaries
        .iter()
        .map(|s| format!("{SUMMARY_KEY}{}\":\"{}\"", s.node, s.encode()))
        .collect();
    writeln!(w, "\"otherData\":{{{}}}}}", other.join(","))?;
    w.flush()?;
    drop(w);
    std::fs::rename(&tmp, path)?;
    for p in parts {
        let _ = std::fs::remove_file(p);
    }
    let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    Ok(Merged {
        path: path.to_path_buf(),
        summaries,
        missing,
        bytes,
    })
}
