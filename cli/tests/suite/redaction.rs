//! End-to-end tests of output redaction (SPEC §8, docs/redaction.md) through the `vibeos-exec`
//! binary, for the gaps a black-box probe found: a private key cut open by paging or `head`,
//! a secret split by an output cap inside one long line of minified JSON, JSON and dict forms
//! of credentials, and values of secret-looking names that hold no credential. (The basic
//! cases are in `parity.rs`.)

// Tests report failures by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use vibeos_testkit::Sandbox;

/// A made-up OpenSSH private key: the BEGIN line, nine base64 lines, the END line.
fn fake_key() -> (String, Vec<String>) {
    let lines: Vec<String> = (0..9)
        .map(|i| {
            format!(
                "b3Bl{i}{}",
                "Zq8XwKp2Lm7RtVb4Nc9Hd1Fg6Js3YaQeWu5TiOy".repeat(2)
            )
        })
        .map(|l| l[..70].to_string())
        .collect();
    let key = format!(
        "-----BEGIN OPENSSH PRIVATE KEY-----\n{}\n-----END OPENSSH PRIVATE KEY-----\n",
        lines.join("\n")
    );
    (key, lines)
}

/// The 12-character pieces of `secret` that `out` shows, if any.
fn pieces_shown(out: &str, secret: &str) -> Vec<String> {
    (0..=secret.len().saturating_sub(12))
        .map(|i| &secret[i..i + 12])
        .filter(|p| out.contains(p))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_private_key_cut_open_by_paging_or_head_shows_none_of_its_lines() {
    // `read_file(key, limit=4)` shows the BEGIN line and three key lines, `head -c 300` the
    // BEGIN line and a line and a half: no END line, which the key pattern needed.
    let sb = Sandbox::new();
    let (key, lines) = fake_key();
    std::fs::write(sb.work().join("id_test"), &key).unwrap();
    for (what, script) in [
        (
            "read_file limit=4",
            "from vibeos_tools import read_file\n\
             print('before')\n\
             print(read_file('id_test', limit=4)['content'])\n",
        ),
        (
            "read_file from offset 5",
            "from vibeos_tools import read_file\n\
             print('before')\n\
             print(read_file('id_test', offset=5)['content'])\n\
             print('after')\n",
        ),
        (
            "terminal head -c 300",
            "from vibeos_tools import terminal\n\
             r = terminal('head -c 300 id_test')\n\
             print('before')\n\
             print(r['output'])\n\
             print('terminal redactions', r['redactions'])\n",
        ),
    ] {
        let r = sb.run_json(script, &[]);
        assert_eq!(r["status"], "success", "{what}: {r}");
        let out = r["output"].as_str().unwrap();
        for line in &lines {
            assert_eq!(
                pieces_shown(out, line),
                Vec::<String>::new(),
                "{what}: {out}"
            );
        }
        assert!(out.starts_with("before\n"), "{what}: {out}");
        assert!(out.contains("[REDACTED:private_key]"), "{what}: {out}");
        if what.starts_with("terminal") {
            // Redacted by the terminal tool already, before the script printed it.
            assert!(out.contains("terminal redactions 1"), "{what}: {out}");
        } else {
            assert_eq!(r["redactions"], 1, "{what}: {r}");
        }
        if what.contains("offset") {
            // The END line closes what is replaced: later output stays.
            assert!(out.ends_with("after\n"), "{what}: {out}");
        }
    }
}

#[test]
fn a_failed_script_s_error_line_quotes_its_last_stderr_line_as_redacted_in_context() {
    // The error quotes the last line of stderr. On its own that line was the last base64 line
    // of a private key, or the value under `aws_secret_access_key =`: neither is a secret
    // alone, so it went out in clear while the output redacted it (stop 48's probe).
    let sb = Sandbox::new();
    let (key, lines) = fake_key();
    std::fs::write(sb.work().join("id_test"), &key).unwrap();
    let aws = "Zq9wJalrXUtnFEMI/K7MDENG/bPxRfiCYzT4Ku8d";
    for (what, script, secret) in [
        (
            "key without its END line",
            "import sys\n\
             text = open('id_test').read().splitlines()\n\
             sys.stderr.write('loading key:\\n' + '\\n'.join(text[:-1]) + '\\n')\n\
             sys.exit(1)\n"
                .to_string(),
            lines[8].clone(),
        ),
        (
            "aws value on its own line",
            format!(
                "import sys\n\
                 sys.stderr.write('aws_secret_access_key =\\n{aws}\\n')\n\
                 sys.exit(1)\n"
            ),
            aws.to_string(),
        ),
    ] {
        let r = sb.run_json(&script, &[]);
        assert_eq!(r["status"], "error", "{what}: {r}");
        let error = r["error"].as_str().unwrap();
        let out = r["output"].as_str().unwrap();
        assert_eq!(
            pieces_shown(error, &secret),
            Vec::<String>::new(),
            "{what}: {r}"
        );
        assert_eq!(
            pieces_shown(out, &secret),
            Vec::<String>::new(),
            "{what}: {r}"
        );
        assert!(
            error.starts_with("the script exited with code 1: "),
            "{what}: {error}"
        );
        assert!(error.contains("[REDACTED:"), "{what}: {error}");
        // `redactions` counts what was replaced in the output and in the error (the marker
        // the error took from the output's last line went uncounted).
        let markers = out.matches("[REDACTED").count() + error.matches("[REDACTED").count();
        assert_eq!(
            r["redactions"].as_u64(),
            Some(markers as u64),
            "{what}: {r}"
        );
    }
}

/// A script writing one minified JSON line of about 150 KB (`{"id":0,"name":"user00000"},…`)
/// with `"token":"<secret>"` placed so the secret starts at byte `at`; `secret` is a Python
/// expression.
fn minified_json_writer(secret: &str, at: usize) -> String {
    format!(
        "import json, os, sys\n\
         recs = [{{'id': i, 'name': 'user%05d' % i}} for i in range(5000)]\n\
         s = json.dumps(recs, separators=(',', ':'))\n\
         sec = {secret}\n\
         f = '\"token\":\"' + sec + '\"'\n\
         s = s[:{at} - 9] + f + s[{at} - 9 + len(f):]\n\
         sys.stdout.write(s + '\\n')\n"
    )
}

/// Runs `writer` directly and through `terminal`, and returns what each showed and its
/// redaction count. The terminal tool's output (redacted by the tool, before the script gets
/// it) goes to a file, so the script's own output cap does not cut it again.
fn run_both_ways(sb: &Sandbox, writer: &str) -> [(&'static str, String, u64); 2] {
    std::fs::write(sb.work().join("writer.py"), writer).unwrap();
    let direct = sb.run_json(writer, &[]);
    assert_eq!(direct["status"], "success", "{direct}");
    let via_terminal = sb.run_json(
        "import json, sys\n\
         from vibeos_tools import terminal\n\
         r = terminal(sys.executable + ' writer.py')\n\
         open('terminal-output.txt', 'w').write(r['output'])\n\
         print(json.dumps({'truncated': r['truncated'], 'redactions': r['redactions']}))\n",
        &[],
    );
    assert_eq!(via_terminal["status"], "success", "{via_terminal}");
    let summary: Value =
        serde_json::from_str(via_terminal["output"].as_str().unwrap().trim()).unwrap();
    assert_eq!(summary["truncated"], true, "{summary}");
    [
        (
            "execute_code output",
            direct["output"].as_str().unwrap().to_string(),
            direct["redactions"].as_u64().unwrap(),
        ),
        (
            "terminal output",
            std::fs::read_to_string(sb.work().join("terminal-output.txt")).unwrap(),
            summary["redactions"].as_u64().unwrap(),
        ),
    ]
}

#[test]
fn a_secret_in_minified_json_split_by_an_output_cap_shows_no_part_of_itself() {
    // Both caps keep a 20 KiB head of 50 KiB. The cut used to back off at most 4 KiB to
    // whitespace, which one long line has none of: it cut again at 16384 bytes, inside the
    // token placed there, and showed 26 of its 36 characters with no redaction.
    let github = "ghp_Zq8XwKp2Lm7RtVb4Nc9Hd1Fg6Js3YaQeWu5T";
    let env_secret = "Mw3Tq9Ze7Kx1Vr5Pb8Ly2";
    let mut sb = Sandbox::new();
    sb.set_env("MY_API_TOKEN", env_secret);
    let head_cut = 20 * 1024;
    for (secret, at, replaced) in [
        (github, head_cut - 4096 - 30, true),
        (github, head_cut - 20, false),
        (env_secret, head_cut - 4096 - 10, true),
        (env_secret, head_cut - 10, false),
    ] {
        let writer = minified_json_writer(&format!("{secret:?}"), at);
        for (what, out, redactions) in run_both_ways(&sb, &writer) {
            let what = format!("{what}, {secret} at {at}");
            assert!(out.contains("output truncated"), "{what}: not truncated");
            assert_eq!(pieces_shown(&out, secret), Vec::<String>::new(), "{what}");
            // What the cut split goes whole, up to its quote; not 4 KiB of records.
            let head = &out[..out.find("\n\n... [").unwrap()];
            assert!(head.len() > head_cut - 64, "{what}: head of {}", head.len());
            if replaced {
                // Kept whole by the cut, so the redaction recognised it.
                assert!(out.contains("\"token\":\"[REDACTED:"), "{what}");
                assert_eq!(redactions, 1, "{what}");
            } else {
                assert!(
                    head.ends_with("\"token\":\""),
                    "{what}: {}",
                    &head[head.len() - 40..]
                );
                assert_eq!(redactions, 0, "{what}");
            }
        }
    }
}

#[test]
fn json_dict_and_env_forms_are_redacted_and_non_credentials_are_not() {
    let mut sb = Sandbox::new();
    sb.set_env("MY_API_TOKEN", "trailingsecret777\n");
    sb.set_env("GIT_AUTHOR_NAME", "Alice Example");
    sb.set_env("GIT_AUTHOR_EMAIL", "alice@example.com");
    sb.set_env("TOKENIZERS_PARALLELISM", "enabled");
    let script = "import json\n\
        H = {'Authorization': 'Bearer abcdefghijklmnopqrstuvwxyz012345'}\n\
        print(json.dumps(H))\n\
        print(H)\n\
        print(json.dumps({'Credentials': {'AccessKeyId': 'ASIAIOSFODNN7EXAMPLE',\n\
              'SecretAccessKey': 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY'}}))\n\
        print('token is trailingsecret777 ok')\n\
        print('Author: Alice Example <alice@example.com>, tokenizer: enabled')\n\
        print('visit http://localhost:8080?invite=alice@example.com')\n\
        print('id=sk-payments-service-deployment-v2')\n";
    let r = sb.run_json(script, &[]);
    assert_eq!(r["status"], "success", "{r}");
    let out = r["output"].as_str().unwrap();
    for secret in [
        "abcdefghijklmnopqrstuvwxyz012345",
        "ASIAIOSFODNN7EXAMPLE",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "trailingsecret777",
    ] {
        assert!(!out.contains(secret), "{secret} shown: {out}");
    }
    assert!(out.contains("token is [REDACTED:MY_API_TOKEN] ok"), "{out}");
    for kept in [
        "Author: Alice Example <alice@example.com>, tokenizer: enabled",
        "visit http://localhost:8080?invite=alice@example.com",
        "id=sk-payments-service-deployment-v2",
    ] {
        assert!(out.contains(kept), "{kept} changed: {out}");
    }
    assert_eq!(r["redactions"], 5, "{r}");
}

#[test]
fn a_secret_value_that_is_not_utf8_is_redacted_as_the_output_shows_it() {
    // Stop 50's probe: the value was skipped when the redactor was built, so printing its
    // bytes (`sys.stdout.buffer`) showed it, with U+FFFD for the bad byte.
    use std::os::unix::ffi::OsStringExt;
    let mut sb = Sandbox::new();
    let value = b"abcdefgh\xffijklmnopqrstuv".to_vec();
    sb.env.push((
        "MY_TOKEN_BIN".into(),
        std::ffi::OsString::from_vec(value.clone()),
    ));
    std::fs::write(sb.work().join("value.bin"), &value).unwrap();
    let r = sb.run_json(
        "import sys\nsys.stdout.buffer.write(b'raw: ' + open('value.bin', 'rb').read() + b'\\n')\n",
        &[],
    );
    let out = r["output"].as_str().unwrap();
    assert_eq!(r["status"], "success", "{r}");
    assert!(!out.contains("ijklmnop"), "the value was shown: {out:?}");
    assert!(out.contains("[REDACTED"), "{out:?}");
    assert_eq!(r["redactions"], 1, "{r}");
}

/// With `security.redact_output: false` a cap keeps its 40 % and 60 % of one long line: the
/// word each cut split was dropped to protect a secret no redaction would look for, and a
/// 100-byte cap of a 1,000-byte line showed nothing but the marker.
#[test]
fn without_redaction_a_capped_long_line_keeps_its_head_and_tail() {
    let sb = Sandbox::new();
    let script = "import sys\nsys.stdout.write(''.join(chr(65 + i % 26) for i in range(1000)))\n";
    let line: String = (0..1000u32)
        .map(|i| char::from(b'A' + (i % 26) as u8))
        .collect();
    let r = sb.run_json(script, &["--stdout-limit", "100"]);
    assert_eq!(r["status"], "success", "{r}");
    // Redaction on (the default): the split word is dropped, whole.
    assert!(!r["output"].as_str().unwrap().contains(&line[..40]), "{r}");
    sb.write_config("security:\n  redact_output: false\n");
    let r = sb.run_json(script, &["--stdout-limit", "100"]);
    assert_eq!(
        r["output"].as_str().unwrap(),
        format!(
            "{}\n\n... [output truncated: 900 of 1000 bytes omitted] ...\n\n{}",
            &line[..40],
            &line[940..]
        ),
        "{r}"
    );
}
