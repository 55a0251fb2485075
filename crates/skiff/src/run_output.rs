//! How `skiff run` shows results, kept free of I/O: line framing for the
//! streamed `host: line` form, grouping of identical outputs under folded
//! node sets (`-b`), one JSON object per host (`--json`), and the summary.
//! Every function returns the bytes to write; the caller writes them.
//!
//! What skiff itself says about a host (its errors, a server's banner, a
//! signal's name) may carry a server's words and is shown through
//! [`terminal_text`]; the remote command's own output is passed through as
//! it came, as ssh does.

use std::collections::BTreeMap;
use std::time::Duration;

use skiff_engine::{ExitOutcome, SkiffError};
use skiff_proto::{nodeset, terminal_text};

/// Splits one stream of one host into whole lines.
#[derive(Debug, Default)]
pub struct LineSplitter {
    partial: Vec<u8>,
}

impl LineSplitter {
    /// Adds output; returns the lines it completed (without their newline).
    pub fn push(&mut self, data: &[u8]) -> Vec<Vec<u8>> {
        let mut lines = Vec::new();
        let mut rest = data;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            let mut line = std::mem::take(&mut self.partial);
            line.extend_from_slice(&rest[..pos]);
            lines.push(line);
            rest = &rest[pos + 1..];
        }
        self.partial.extend_from_slice(rest);
        lines
    }

    /// The unterminated last line, if any.
    pub fn finish(&mut self) -> Option<Vec<u8>> {
        (!self.partial.is_empty()).then(|| std::mem::take(&mut self.partial))
    }
}

/// `label: line\n` as one buffer, so one write puts out a whole line.
pub fn prefixed_line(label: &str, line: &[u8]) -> Vec<u8> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut out = Vec::with_capacity(label.len() + line.len() + 3);
    out.extend_from_slice(label.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(line);
    out.push(b'\n');
    out
}

/// A notice about `label`'s connection (a banner, a newly recorded host
/// key), which may span lines, as one buffer.
pub fn notice_line(label: &str, text: &str) -> Vec<u8> {
    prefixed_line(label, terminal_text::lines(text).as_bytes())
}

/// Why skiff could not run the command on `label`, as one line.
pub fn error_line(label: &str, e: &SkiffError) -> Vec<u8> {
    let text = format!("skiff: {}", terminal_text::one_line(&e.message));
    prefixed_line(label, text.as_bytes())
}

/// Everything kept about one host once it has finished.
#[derive(Debug)]
pub struct HostRecord {
    pub label: String,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub result: Result<ExitOutcome, SkiffError>,
    pub duration: Duration,
}

/// One host as a line of JSON.
pub fn json_line(rec: &HostRecord) -> String {
    let (exit_code, error) = match &rec.result {
        Ok(outcome) => (
            serde_json::json!(outcome.exit_code()),
            serde_json::Value::Null,
        ),
        Err(e) => (
            serde_json::Value::Null,
            serde_json::json!({ "kind": e.kind.name(), "message": e.to_string() }),
        ),
    };
    let signal = match &rec.result {
        // The server names the signal.
        Ok(ExitOutcome::Signal { name, .. }) => serde_json::json!(terminal_text::one_line(name)),
        _ => serde_json::Value::Null,
    };
    let value = serde_json::json!({
        "host": rec.label,
        "exit_code": exit_code,
        "signal": signal,
        "error": error,
        "stdout": String::from_utf8_lossy(&rec.stdout),
        "stderr": String::from_utf8_lossy(&rec.stderr),
        "duration_ms": (rec.duration.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0,
    });
    let mut line = value.to_string();
    line.push('\n');
    line
}

/// `-b`: hosts with identical output, each group under its folded node
/// set. Returns (for stdout, for stderr). Groups come in the order of their
/// folded names; a host with no output at all is not shown (the summary
/// accounts for it).
pub fn grouped(records: &[HostRecord]) -> (Vec<u8>, Vec<u8>) {
    let mut groups: BTreeMap<(&[u8], &[u8]), Vec<&str>> = BTreeMap::new();
    for rec in records {
        if rec.stdout.is_empty() && rec.stderr.is_empty() {
            continue;
        }
        groups
            .entry((&rec.stdout, &rec.stderr))
            .or_default()
            .push(&rec.label);
    }
    let mut blocks: Vec<(String, &[u8], &[u8])> = groups
        .into_iter()
        .map(|((out, err), labels)| (nodeset::fold(&labels), out, err))
        .collect();
    blocks.sort_by(|a, b| a.0.cmp(&b.0));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    for (name, stdout, stderr) in blocks {
        if !stdout.is_empty() {
            block(&mut out, &name, stdout);
        }
        if !stderr.is_empty() {
            block(&mut err, &name, stderr);
        }
    }
    (out, err)
}

fn block(buf: &mut Vec<u8>, name: &str, body: &[u8]) {
    let rule = "-".repeat(name.chars().count().clamp(15, 72));
    buf.extend_from_slice(format!("{rule}\n{name}\n{rule}\n").as_bytes());
    buf.extend_from_slice(body);
    if !body.ends_with(b"\n") {
        buf.push(b'\n');
    }
}

/// The summary for stderr: counts, then one line per exit code and per
/// error kind with the folded set of hosts.
pub fn summary(records: &[HostRecord]) -> String {
    let mut by_code: BTreeMap<i32, Vec<&str>> = BTreeMap::new();
    let mut by_error: BTreeMap<&'static str, Vec<&str>> = BTreeMap::new();
    for rec in records {
        match &rec.result {
            Ok(outcome) => by_code
                .entry(outcome.exit_code())
                .or_default()
                .push(&rec.label),
            Err(e) => by_error.entry(e.kind.name()).or_default().push(&rec.label),
        }
    }
    let ok = by_code.get(&0).map_or(0, Vec::len);
    let failed: usize = by_code
        .iter()
        .filter(|(c, _)| **c != 0)
        .map(|(_, v)| v.len())
        .sum();
    let errors: usize = by_error.values().map(Vec::len).sum();
    let mut text = format!(
        "skiff run: {} host{}: {ok} ok, {failed} failed, {errors} with errors\n",
        records.len(),
        if records.len() == 1 { "" } else { "s" }
    );
    for (code, labels) in &by_code {
        let what = if *code == 0 {
            "ok".to_string()
        } else {
            format!("exit {code}")
        };
        text.push_str(&format!(
            "  {what} ({}): {}\n",
            labels.len(),
            nodeset::fold(labels)
        ));
    }
    for (kind, labels) in &by_error {
        text.push_str(&format!(
            "  {kind} ({}): {}\n",
            labels.len(),
            nodeset::fold(labels)
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_engine::ErrorKind;

    fn rec(label: &str, out: &str, result: Result<ExitOutcome, SkiffError>) -> HostRecord {
        HostRecord {
            label: label.into(),
            stdout: out.as_bytes().to_vec(),
            stderr: Vec::new(),
            result,
            duration: Duration::from_millis(12),
        }
    }

    #[test]
    fn splitter_keeps_partial_lines_until_complete() {
        let mut s = LineSplitter::default();
        assert!(s.push(b"hel").is_empty());
        assert_eq!(s.push(b"lo\nwor"), vec![b"hello".to_vec()]);
        assert_eq!(s.push(b"ld\n\nx"), vec![b"world".to_vec(), Vec::new()]);
        assert_eq!(s.finish(), Some(b"x".to_vec()));
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn prefixed_line_is_one_whole_line() {
        assert_eq!(prefixed_line("web1", b"up 3 days\r"), b"web1: up 3 days\n");
    }

    #[test]
    fn skiffs_own_lines_show_a_servers_words_escaped() {
        let e = SkiffError::new(ErrorKind::Protocol, "closed: \u{1b}[1A\u{1b}[2Kok");
        assert_eq!(
            error_line("web1", &e),
            b"web1: skiff: closed: \\u{1b}[1A\\u{1b}[2Kok\n"
        );
        // A banner keeps its lines, not its escape sequences.
        assert_eq!(
            notice_line("web1", "Welcome\n\u{1b}[2Jto web1\r"),
            b"web1: Welcome\n\\u{1b}[2Jto web1\\r\n"
        );
        let killed = rec(
            "web1",
            "",
            Ok(ExitOutcome::Signal {
                name: "KILL\u{1b}[2J".into(),
                core_dumped: false,
                message: String::new(),
            }),
        );
        let v: serde_json::Value = serde_json::from_str(&json_line(&killed)).unwrap();
        assert_eq!(v["signal"], "KILL\\u{1b}[2J");
    }

    #[test]
    fn identical_outputs_fold_into_one_block() {
        let records = vec![
            rec("web01", "same\n", Ok(ExitOutcome::Status(0))),
            rec("web02", "same\n", Ok(ExitOutcome::Status(0))),
            rec("web03", "other", Ok(ExitOutcome::Status(0))),
            rec("web04", "same\n", Ok(ExitOutcome::Status(0))),
            rec("web05", "", Ok(ExitOutcome::Status(0))),
        ];
        let (out, err) = grouped(&records);
        let out = String::from_utf8(out).unwrap();
        assert!(err.is_empty());
        assert!(
            out.contains("web[01-02,04]\n---------------\nsame\n"),
            "{out}"
        );
        assert!(out.contains("web03\n---------------\nother\n"), "{out}");
        assert!(!out.contains("web05"), "{out}");
    }

    #[test]
    fn summary_groups_by_exit_code_and_error_kind() {
        let records = vec![
            rec("n1", "", Ok(ExitOutcome::Status(0))),
            rec("n2", "", Ok(ExitOutcome::Status(1))),
            rec("n3", "", Ok(ExitOutcome::Status(1))),
            rec(
                "n4",
                "",
                Err(SkiffError::new(ErrorKind::Connect, "refused")),
            ),
            rec("n5", "", Err(SkiffError::new(ErrorKind::Timeout, "slow"))),
        ];
        let s = summary(&records);
        assert!(
            s.starts_with("skiff run: 5 hosts: 1 ok, 2 failed, 2 with errors\n"),
            "{s}"
        );
        assert!(s.contains("  ok (1): n1\n"), "{s}");
        assert!(s.contains("  exit 1 (2): n[2-3]\n"), "{s}");
        assert!(s.contains("  unreachable (1): n4\n"), "{s}");
        assert!(s.contains("  timeout (1): n5\n"), "{s}");
    }

    #[test]
    fn json_line_carries_result_or_error() {
        let ok = rec("a", "hi\n", Ok(ExitOutcome::Status(3)));
        let v: serde_json::Value = serde_json::from_str(&json_line(&ok)).unwrap();
        assert_eq!(v["host"], "a");
        assert_eq!(v["exit_code"], 3);
        assert!(v["error"].is_null());
        assert_eq!(v["stdout"], "hi\n");
        assert_eq!(v["duration_ms"], 12.0);
        let bad = rec("b", "", Err(SkiffError::new(ErrorKind::Auth, "no key")));
        let v: serde_json::Value = serde_json::from_str(&json_line(&bad)).unwrap();
        assert!(v["exit_code"].is_null());
        assert_eq!(v["error"]["kind"], "auth");
        assert_eq!(v["error"]["message"], "no key");
    }
}
