//! Which files an interpreter needs to start: strict mode's landlock rules and mount reveals
//! grant exactly these, so the lookup (symlinks, venvs, system vs private prefixes) is one job
//! kept apart from building the rules.

use std::path::{Path, PathBuf};

/// The interpreter's executable and prefix. A system prefix (`/usr`, `/usr/local`, `/`) is not
/// granted whole — that would open every program in /usr/bin — only its `lib/python3*` dirs;
/// a private prefix (pyenv, a venv, a conda env) is granted whole.
pub fn interpreter_paths(interpreter: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut prefixes = Vec::new();
    if let Ok(real) = std::fs::canonicalize(interpreter) {
        out.push(real.clone());
        if let Some(prefix) = real.parent().and_then(Path::parent) {
            prefixes.push(prefix.to_path_buf());
        }
    }
    let absolute = if interpreter.is_absolute() {
        Some(interpreter.to_path_buf())
    } else {
        which::which(interpreter).ok()
    };
    if let Some(prefix) = absolute
        .as_deref()
        .and_then(Path::parent)
        .and_then(Path::parent)
    {
        prefixes.push(prefix.to_path_buf());
        // A venv names its base interpreter's bin dir in pyvenv.cfg.
        if let Ok(cfg) = std::fs::read_to_string(prefix.join("pyvenv.cfg")) {
            for line in cfg.lines() {
                if let Some((k, v)) = line.split_once('=') {
                    if k.trim() == "home" {
                        if let Some(base) = Path::new(v.trim()).parent() {
                            prefixes.push(base.to_path_buf());
                        }
                    }
                }
            }
        }
    }
    for prefix in prefixes {
        let Ok(prefix) = std::fs::canonicalize(&prefix) else {
            continue;
        };
        let libs = python_lib_dirs(&prefix);
        let is_venv = prefix.join("pyvenv.cfg").is_file();
        if libs.is_empty() && !is_venv {
            continue; // Not a Python prefix (say, a copied binary): grant nothing around it.
        }
        let system = ["/", "/usr", "/usr/local"]
            .iter()
            .any(|s| prefix == Path::new(s));
        if system {
            out.extend(libs);
        } else {
            out.push(prefix);
        }
    }
    out
}

fn python_lib_dirs(prefix: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(rd) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        for entry in rd.flatten() {
            let name = entry.file_name();
            if name.to_string_lossy().starts_with("python3") && entry.path().is_dir() {
                out.push(entry.path());
            }
        }
    }
    out
}
