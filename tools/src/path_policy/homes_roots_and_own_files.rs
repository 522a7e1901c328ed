//! Attack tests of what a strict script's tool calls tried against a home, a root inside a git dir
//! and vibeos-exec's own files (the probe of stop 54), and must not get.

use super::*;

fn root_in(d: &tempfile::TempDir, rel: &str) -> (PathBuf, PathBuf, PathPolicy) {
    let root = d.path().join(rel);
    std::fs::create_dir_all(&root).unwrap();
    let mut p = PathPolicy::new();
    p.product_places.clear();
    p.add_root(&root, RootAccess::ReadWrite, false).unwrap();
    (d.path().to_path_buf(), root, p)
}

/// A session dir that is a home: every start-up file a later shell, git, ssh, editor or
/// desktop session reads commands from is refused; look-alikes stay writable.
#[test]
fn a_homes_start_up_files_are_not_written() {
    let d = tempfile::tempdir().unwrap();
    let (_, home, p) = root_in(&d, "fakehome");
    for bad in [
        ".config/git/config",
        ".CONFIG/Git/attributes",
        ".ssh/authorized_keys",
        ".ssh/rc",
        ".ssh/config",
        ".bash_aliases",
        ".bash_logout",
        ".zshenv",
        ".zlogout",
        ".cshrc",
        ".tcshrc",
        ".kshrc",
        ".inputrc",
        ".config/fish/config.fish",
        ".config/fish/conf.d/x.fish",
        ".local/bin/git",
        ".config/autostart/evil.desktop",
        ".config/environment.d/10-path.conf",
        ".config/systemd/user/evil.service",
        ".pam_environment",
        ".xprofile",
        ".xsession",
        ".xinitrc",
        ".vimrc",
        ".exrc",
        ".nanorc",
        ".hgrc",
        ".npmrc",
        "other/home/.vim/plugin/x.vim",
    ] {
        let e = p.write_atomic(&home.join(bad), b"x").unwrap_err();
        assert_eq!(e.kind, "OutsideSandbox", "{bad}: {e:?}");
        assert!(e.message.contains("run code"), "{bad}: {}", e.message);
        assert!(!home.join(bad).exists(), "{bad} was written");
    }
    for dir in [".ssh", ".config/git", ".local/bin", ".config/fish"] {
        assert!(!home.join(dir).exists(), "{dir} was made");
    }
    for ok in [
        ".bashrc.bak",
        "notes/.vimrc.orig",
        ".config/other/settings.ini",
        ".local/share/app/data",
        "ssh/notes.txt",
        "bin/tool",
    ] {
        p.write_atomic(&home.join(ok), b"x").unwrap();
    }
}

/// A session dir inside a git dir (`--cwd repo/.git/hooks`) or a bare repository: the git-dir
/// check looks at the root's own path too. An existing executable hook keeps its mode when
/// replaced, so this was code execution at the next commit.
#[test]
fn a_root_inside_a_git_dir_gets_no_writes() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let (_, hooks, p) = root_in(&d, "repo/.git/hooks");
    let hook = hooks.join("pre-commit");
    std::fs::write(&hook, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    for name in ["pre-commit", "post-checkout", "sub/x"] {
        let e = p
            .write_atomic(&hooks.join(name), b"#!/bin/sh\ntouch PWNED\n")
            .unwrap_err();
        assert!(e.message.contains("run code"), "{name}: {}", e.message);
    }
    assert_eq!(
        std::fs::read_to_string(&hook).unwrap(),
        "#!/bin/sh\nexit 0\n"
    );
    assert!(!hooks.join("post-checkout").exists());

    let d = tempfile::tempdir().unwrap();
    let bare = d.path().join("project.git");
    for dir in ["objects", "refs", "hooks"] {
        std::fs::create_dir_all(bare.join(dir)).unwrap();
    }
    std::fs::write(bare.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    let mut p = PathPolicy::new();
    p.product_places.clear();
    p.add_root(&bare.join("hooks"), RootAccess::ReadWrite, false)
        .unwrap();
    let e = p
        .write_atomic(&bare.join("hooks/pre-commit"), b"#!/bin/sh\n")
        .unwrap_err();
    assert!(e.message.contains("run code"), "{}", e.message);
    assert!(!bare.join("hooks/pre-commit").exists());
}

/// A root that holds vibeos-exec's home: its config (credentials in MCP server headers) and
/// logs are not read, by name, through a symlink, or by a directory walk's check.
#[test]
fn vibeos_own_config_and_logs_are_not_read_beneath_a_root() {
    let d = tempfile::tempdir().unwrap();
    let (_, root, mut p) = root_in(&d, "fakehome");
    let home = root.join(".vibeos");
    std::fs::create_dir_all(home.join("logs")).unwrap();
    std::fs::write(home.join("config.yaml"), "Api-Key: SECRET\n").unwrap();
    std::fs::write(home.join("logs/agent.log"), "SECRET\n").unwrap();
    std::fs::write(root.join("notes.txt"), "fine").unwrap();
    std::os::unix::fs::symlink(".vibeos", root.join("conf")).unwrap();
    p.product_places = vec![
        real_as_far_as_it_exists(&home.join("config.yaml")),
        real_as_far_as_it_exists(&home.join("logs")),
    ];
    for bad in [
        ".vibeos/config.yaml",
        ".vibeos/logs/agent.log",
        ".vibeos/logs",
        "conf/config.yaml",
    ] {
        let e = p.open_read(&root.join(bad)).unwrap_err();
        assert_eq!(e.kind, "OutsideSandbox", "{bad}: {e:?}");
        assert!(!e.message.contains("SECRET"), "{}", e.message);
        assert!(p.check_read(&root.join(bad)).is_err(), "{bad}");
    }
    assert!(p.open_read(&root.join("notes.txt")).is_ok());
    assert!(
        p.check_read(&home).is_ok(),
        "the home dir itself may be listed"
    );
}
