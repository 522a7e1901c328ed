//! One edit at a time per file, across the calls of this process.
//!
//! `patch` reads a file, changes it in memory and writes it back whole. Two calls editing one
//! file at once (a script's threads, its subprocesses on their own connections, a turn's calls
//! the planner ran in parallel under different spellings of the path) both read the old text,
//! and the second write dropped the first's edit while both reported success: 20 patches from
//! 20 threads kept 1 to 7 of their edits. Each edit (and each `write_file`, so a patch never
//! writes back a file another call just replaced) holds the lock of its files from its read to
//! its write. The locks are stripes of a fixed table, so memory stays flat however many files
//! are edited; two files sharing a stripe only wait for each other.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// Stripes of the lock table: enough that unrelated files rarely share one.
const STRIPES: usize = 64;

static TABLE: [Mutex<()>; STRIPES] = [const { Mutex::new(()) }; STRIPES];

/// The locks of some files, held until dropped.
pub(crate) struct FileLocks {
    _held: Vec<MutexGuard<'static, ()>>,
}

/// Takes the locks of `paths` (absolute, as the tools resolved them), in one order for every
/// caller, so two calls locking several files cannot wait for each other.
pub(crate) fn lock(paths: &[PathBuf]) -> FileLocks {
    let mut stripes: Vec<usize> = paths.iter().map(|p| stripe(&identity(p))).collect();
    stripes.sort_unstable();
    stripes.dedup();
    FileLocks {
        _held: stripes
            .into_iter()
            .map(|i| TABLE[i].lock().unwrap_or_else(|p| p.into_inner()))
            .collect(),
    }
}

/// One name for every spelling of a file: the canonical path when it exists, else its
/// parent's canonical path and its name, else the path cleaned of `.` and `..` lexically.
fn identity(path: &Path) -> PathBuf {
    if let Ok(real) = std::fs::canonicalize(path) {
        return real;
    }
    let clean = crate::planner::lexical(path);
    match (clean.parent(), clean.file_name()) {
        (Some(parent), Some(name)) => std::fs::canonicalize(parent)
            .map(|p| p.join(name))
            .unwrap_or(clean),
        _ => clean,
    }
}

fn stripe(path: &Path) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut h);
    (h.finish() % STRIPES as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_a_file_is_one_identity() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/f"), "x").unwrap();
        let plain = identity(&d.path().join("sub/f"));
        assert_eq!(identity(&d.path().join("sub/./f")), plain);
        assert_eq!(identity(&d.path().join("sub/../sub/f")), plain);
        std::os::unix::fs::symlink(d.path().join("sub"), d.path().join("link")).unwrap();
        assert_eq!(identity(&d.path().join("link/f")), plain);
        // A file not created yet: by its parent.
        assert_eq!(
            identity(&d.path().join("link/new")),
            identity(&d.path().join("sub/new"))
        );
    }

    #[test]
    fn locks_of_several_files_are_taken_in_one_order() {
        let (a, b) = (PathBuf::from("/x/a"), PathBuf::from("/x/b"));
        let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let (a, b, done) = (a.clone(), b.clone(), done.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let _l = if i % 2 == 0 {
                            lock(&[a.clone(), b.clone()])
                        } else {
                            lock(&[b.clone(), a.clone(), a.clone()])
                        };
                    }
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(done.load(std::sync::atomic::Ordering::SeqCst), 8);
    }
}
