//! The rendezvous file: where node 0 tells the other nodes its address and,
//! when the launcher handed out no `HYFI_TOKEN`, the job's token.
//!
//! The file holds one line, `job addr [token]`. It is the job's secret when
//! it carries the token, so:
//!
//! - node 0 writes it to a temporary name created with `O_EXCL` and mode
//!   0600, then renames it into place (readers never see half a line; a stale
//!   file of a crashed job is replaced, not appended to);
//! - a file in `$TMPDIR/hyfi-<uid>/` (the default under `mpirun` and for
//!   `HYFI_COORD` jobs without a token) lives in a directory created mode
//!   0700; an existing one must be a directory of ours with no access for
//!   group or others, or setup stops with an error that says so;
//! - readers trust a file only if it is a regular file of their own user
//!   with no group or other access: a file planted by another user is never
//!   believed;
//! - node 0 removes the file when the mesh is complete or setup fails (by
//!   then every node has read it); a file left by a killed node 0 is
//!   replaced by the next job's.
//!
//! Which file, and the private directory's name, the launcher's environment
//! says ([`Rendezvous::File`](crate::bootstrap::Rendezvous::File),
//! [`private_dir`]): that part is the bootstrap's, whatever the transport.
//! The file itself, what it holds and whom to believe, is the TCP
//! transport's way to meet.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::bootstrap::{euid, parse_token, private_dir, token_hex, Token};
use crate::error::NetError;

/// `$TMPDIR`, or `/tmp`.
fn tmp_dir() -> PathBuf {
    std::env::var_os("TMPDIR")
        .filter(|t| !t.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"))
}

/// The file that carries the token of a `HYFI_COORD` job started without
/// `HYFI_TOKEN` (readable by this user's nodes on this host only).
pub(crate) fn token_file(job: u64) -> PathBuf {
    private_dir(&tmp_dir()).join(format!("hyfi-job-{job}.addr"))
}

/// Is `path` in this user's private directory (so the job is local: every
/// node that can read it runs on this host)?
pub(crate) fn is_private(path: &Path) -> bool {
    let uid_dir = format!("hyfi-{}", euid());
    path.parent()
        .and_then(|d| d.file_name())
        .is_some_and(|n| n == uid_dir.as_str())
}

/// Why a directory is not a private directory of ours.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DirError {
    /// Its metadata cannot be read.
    #[error("cannot inspect it: {0}")]
    Inspect(#[source] std::io::Error),
    /// A file, or a symbolic link (never followed: it could lead anywhere).
    #[error("it is not a directory (a symbolic link or a file?)")]
    NotADir,
    /// Another user's directory.
    #[error("it belongs to uid {owner}, not to this user (uid {me})")]
    NotOurs {
        /// Its owner.
        owner: u32,
        /// This process's effective user id.
        me: u32,
    },
    /// Group or others may use it.
    #[error("its mode is {mode:o}: group and others may use it")]
    Open {
        /// Its permission bits.
        mode: u32,
    },
}

/// Why the directory `dir` is not a private directory of ours, if it is not.
fn check_private_dir(dir: &Path) -> Result<(), DirError> {
    let m = std::fs::symlink_metadata(dir).map_err(DirError::Inspect)?;
    if !m.file_type().is_dir() {
        return Err(DirError::NotADir);
    }
    if m.uid() != euid() {
        return Err(DirError::NotOurs {
            owner: m.uid(),
            me: euid(),
        });
    }
    if m.mode() & 0o077 != 0 {
        return Err(DirError::Open {
            mode: m.mode() & 0o777,
        });
    }
    Ok(())
}

fn file_error(path: &Path, why: impl Into<String>) -> NetError {
    NetError::Rendezvous {
        path: path.display().to_string(),
        why: why.into(),
    }
}

/// Creates `dir` mode 0700, or checks that the existing one is ours and
/// private.
fn ensure_private_dir(dir: &Path) -> Result<(), NetError> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            check_private_dir(dir).map_err(|why| {
                file_error(
                    dir,
                    format!(
                        "{why}; remove it (or give it to this user with mode 0700), or set \
                         TMPDIR to a directory of yours"
                    ),
                )
            })
        }
        Err(e) => Err(file_error(
            dir,
            format!("cannot create it ({e}); set TMPDIR to a writable directory"),
        )),
    }
}

/// The published file; dropping it removes the file.
pub(crate) struct Published {
    path: PathBuf,
}

impl Drop for Published {
    fn drop(&mut self) {
        // Removing a file another job already replaced would hurt it, but a
        // job key names one job, so only our own file can be here.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Removes the rendezvous files in this user's private directory `dir`
/// (other than `keep`) whose publisher is gone: a node 0 killed while it
/// waited for its peers leaves its file, with the token in it.
fn remove_stale(dir: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if path == keep || !name.starts_with("hyfi-") || !name.ends_with(".addr") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let pid = text
            .lines()
            .find_map(|l| l.strip_prefix("pid "))
            .and_then(|p| p.trim().parse::<i32>().ok());
        // Only a publisher known to be gone: a file without a pid, or of a
        // live process (even one that reused the pid), stays.
        if let Some(pid) = pid {
            if pid > 0
                && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                    == Err(nix::errno::Errno::ESRCH)
            {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// Publishes `job addr [token]` at `path` (see the module docs).
pub(crate) fn publish(
    path: &Path,
    job: u64,
    addr: &str,
    token: Option<&Token>,
) -> Result<Published, NetError> {
    if is_private(path) {
        let dir = path.parent().expect("a private path has a parent");
        ensure_private_dir(dir)?;
    }
    let name = path
        .file_name()
        .ok_or_else(|| file_error(path, "it names no file; set HYFI_RENDEZVOUS to a file path"))?
        .to_string_lossy()
        .into_owned();
    let tmp = path.with_file_name(format!(".{name}.tmp.{}", std::process::id()));
    let mut line = format!("{job} {addr}");
    if let Some(t) = token {
        line += &format!(" {}", token_hex(t));
    }
    // The second line names the publisher, so that a later job of this
    // user can tell a file left by a node 0 that was killed (SIGKILL gives
    // no chance to remove it) and remove it.
    line += &format!("\npid {}\n", std::process::id());
    if is_private(path) {
        if let Some(dir) = path.parent() {
            remove_stale(dir, path);
        }
    }
    let create = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
    };
    let mut f = match create() {
        // Left by a process of ours with the same pid that died mid-write.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let _ = std::fs::remove_file(&tmp);
            create()
        }
        other => other,
    }
    .map_err(|e| {
        file_error(
            &tmp,
            format!("node 0 cannot create it ({e}); set HYFI_RENDEZVOUS or TMPDIR to a directory of yours"),
        )
    })?;
    let written = f.write_all(line.as_bytes()).and_then(|_| f.sync_all());
    drop(f);
    if let Err(e) = written.and_then(|_| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(file_error(
            path,
            format!(
                "node 0 cannot write it ({e}); if another user's file is in the way, remove it \
                 or set HYFI_RENDEZVOUS to a path of yours"
            ),
        ));
    }
    Ok(Published {
        path: path.to_path_buf(),
    })
}

/// What node 0 published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Node 0's `host:port`.
    pub addr: String,
    /// The job's token, when node 0 made it.
    pub token: Option<Token>,
}

/// Why the rendezvous file gives this node no usable entry (yet): node 0
/// may not have written it yet, or it is stale, or it cannot be trusted.
/// Setup retries until its deadline, then reports the last of these.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EntryError {
    /// The directory of a file in the private directory is not private.
    #[error("its directory is not private: {0}")]
    DirNotPrivate(#[source] DirError),
    /// The file cannot be opened (not there yet, most likely).
    #[error("not readable yet ({0})")]
    NotReadable(#[source] std::io::Error),
    /// Its metadata cannot be read.
    #[error("cannot inspect it: {0}")]
    Inspect(#[source] std::io::Error),
    /// Not a regular file.
    #[error("it is not a regular file")]
    NotAFile,
    /// Another user's file: never believed.
    #[error("it belongs to uid {owner}, not to this user (uid {me}): not trusted; remove it")]
    NotOurs {
        /// Its owner.
        owner: u32,
        /// This process's effective user id.
        me: u32,
    },
    /// Group or others may have written it: never believed.
    #[error("its mode is {mode:o}: others may have written it; not trusted")]
    Open {
        /// Its permission bits.
        mode: u32,
    },
    /// Reading it failed.
    #[error("cannot read it: {0}")]
    Unreadable(#[source] std::io::Error),
    /// Less than `job addr` (a half-written file cannot be seen: it is
    /// renamed into place whole).
    #[error("it is empty or incomplete")]
    Incomplete,
    /// The entry of another job.
    #[error("it holds job {theirs}, not this job ({job}): a stale file, to be replaced by node 0")]
    Stale {
        /// The job the file names, as written.
        theirs: String,
        /// This job.
        job: u64,
    },
    /// The token field is not a token.
    #[error("its token is not 32 hexadecimal digits")]
    BadToken,
    /// The entry carries no token, and this node has none: node 0 was
    /// given one.
    #[error(
        "it carries no token (node 0 was given HYFI_TOKEN, this node was not): give every \
         node the same HYFI_TOKEN"
    )]
    NoTokenGiven,
    /// The token file of a `HYFI_COORD` job carries no token.
    #[error("it carries no token")]
    NoToken,
}

/// Reads the entry of `job` at `path`; `Err` says why there is none (yet).
pub(crate) fn read(path: &Path, job: u64) -> Result<Entry, EntryError> {
    if is_private(path) {
        let dir = path.parent().expect("a private path has a parent");
        if dir.exists() {
            check_private_dir(dir).map_err(EntryError::DirNotPrivate)?;
        }
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(EntryError::NotReadable)?;
    // Checked on the open file, so it cannot be swapped in between.
    let m = f.metadata().map_err(EntryError::Inspect)?;
    if !m.file_type().is_file() {
        return Err(EntryError::NotAFile);
    }
    if m.uid() != euid() {
        return Err(EntryError::NotOurs {
            owner: m.uid(),
            me: euid(),
        });
    }
    if m.mode() & 0o077 != 0 {
        return Err(EntryError::Open {
            mode: m.mode() & 0o777,
        });
    }
    let mut s = String::new();
    f.take(4096)
        .read_to_string(&mut s)
        .map_err(EntryError::Unreadable)?;
    let first = s.lines().next().unwrap_or("");
    let mut it = first.split_whitespace();
    let (Some(j), Some(addr)) = (it.next(), it.next()) else {
        return Err(EntryError::Incomplete);
    };
    if j.parse::<u64>() != Ok(job) {
        return Err(EntryError::Stale {
            theirs: j.to_string(),
            job,
        });
    }
    let token = match it.next() {
        Some(t) => Some(parse_token(t).ok_or(EntryError::BadToken)?),
        None => None,
    };
    Ok(Entry {
        addr: addr.to_string(),
        token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(what: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "hyfi-rv-test-{what}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_file_whose_publisher_is_gone_is_removed_and_a_live_ones_stays() {
        let d = scratch("stale");
        // A pid no process has: a child that ran and was reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let stale = d.join("hyfi-job-1.addr");
        std::fs::write(&stale, format!("1 127.0.0.1:1\npid {dead}\n")).unwrap();
        let live = d.join("hyfi-job-2.addr");
        std::fs::write(
            &live,
            format!("2 127.0.0.1:2\npid {}\n", std::process::id()),
        )
        .unwrap();
        let unnamed = d.join("hyfi-job-3.addr");
        std::fs::write(&unnamed, "3 127.0.0.1:3\n").unwrap();
        remove_stale(&d, &d.join("hyfi-job-4.addr"));
        assert!(!stale.exists(), "the dead publisher's file stays");
        assert!(live.exists() && unnamed.exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn published_file_is_private_replaces_a_stale_one_and_goes_away() {
        let d = scratch("pub");
        let path = d.join("job.addr");
        // A stale file of a crashed job, world-readable.
        std::fs::write(&path, "7 127.0.0.1:1 00\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read(&path, 9)
            .unwrap_err()
            .to_string()
            .contains("mode is 644"));
        let token = [0x5a; 16];
        let p = publish(&path, 9, "127.0.0.1:4000", Some(&token)).unwrap();
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!(m.mode() & 0o777, 0o600);
        assert_eq!(
            read(&path, 9).unwrap(),
            Entry {
                addr: "127.0.0.1:4000".into(),
                token: Some(token)
            }
        );
        assert!(read(&path, 8).unwrap_err().to_string().contains("stale"));
        drop(p);
        assert!(!path.exists());
        assert_eq!(
            std::fs::read_dir(&d).unwrap().count(),
            0,
            "no temporary left"
        );
        std::fs::remove_dir(&d).unwrap();
    }

    #[test]
    fn a_private_directory_must_be_private() {
        let d = scratch("dir");
        let private = private_dir(&d);
        let path = private.join("hyfi-x.addr");
        assert!(is_private(&path) && !is_private(&d.join("x.addr")));
        let p = publish(&path, 1, "127.0.0.1:1", None).unwrap();
        let m = std::fs::metadata(&private).unwrap();
        assert_eq!(m.mode() & 0o777, 0o700);
        assert_eq!(read(&path, 1).unwrap().token, None);
        drop(p);
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = publish(&path, 1, "127.0.0.1:1", None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("mode is 755") && e.contains("TMPDIR"), "{e}");
        assert!(read(&path, 1)
            .unwrap_err()
            .to_string()
            .contains("not private"));
        std::fs::remove_dir(&private).unwrap();
        std::fs::remove_dir(&d).unwrap();
    }
}
