//! A manual page (man(7) roff) from the Markdown of a reference page such
//! as docs/skiffd-config.md: pure, no I/O.
//!
//! The subset understood is what the reference pages use: `#`/`##`/`###`
//! headings, paragraphs, pipe tables (a header row, a `---` row, then rows;
//! `\|` is a pipe inside a cell), `-` lists nested by two spaces, fenced
//! code blocks, and inline `code`, `**bold**`, `*italic*` and
//! `[text](link)`. The first `#` heading is the page's title and is left
//! out (the NAME section says it); `##` starts a section, `###` a
//! subsection. A table row becomes a tagged paragraph: its first cell is
//! the tag, the middle cells follow as `Header: value` lines, and the last
//! cell is the text.

use std::fmt::Write as _;

/// Why a page could not be made; the line is the Markdown's, from 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    #[error("line {line}: code block never closed")]
    UnclosedCodeBlock { line: usize },
    #[error("line {line}: table row has {found} cells, its header {expected}")]
    RaggedTable {
        line: usize,
        expected: usize,
        found: usize,
    },
    #[error("line {line}: table header without its `|---|` line")]
    TableWithoutRule { line: usize },
}

/// What the page says about itself besides the Markdown's text.
#[derive(Debug, Clone)]
pub struct Page<'a> {
    /// `skiffd_config`
    pub name: &'a str,
    /// `5`
    pub section: &'a str,
    /// The NAME line's description.
    pub summary: &'a str,
    /// `skiff 0.1.0`: the footer's source.
    pub source: &'a str,
    /// `File Formats`: the header's manual name.
    pub manual: &'a str,
    /// Lines of the SYNOPSIS section (none: no such section).
    pub synopsis: &'a [&'a str],
    /// Lines of a FILES section after the text (none: no such section).
    pub files: &'a [&'a str],
    /// Pages for SEE ALSO, `sshd_config(5)` (none: no such section).
    pub see_also: &'a [&'a str],
}

/// One block of the Markdown.
#[derive(Debug, PartialEq, Eq)]
enum Block {
    Heading {
        level: usize,
        text: String,
    },
    Paragraph(String),
    /// Items as (depth, text), depth 0 for the outermost.
    List(Vec<(usize, String)>),
    Table {
        header: Vec<String>,
        rows: Vec<Vec<String>>,
    },
    Code(Vec<String>),
}

/// The page for `markdown`.
pub fn render(page: &Page<'_>, markdown: &str) -> Result<String, ConvertError> {
    let blocks = parse(markdown)?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        ".TH {} {} \"\" \"{}\" \"{}\"",
        page.name.to_ascii_uppercase(),
        page.section,
        quoted(page.source),
        quoted(page.manual)
    );
    out.push_str(".SH NAME\n");
    out.push_str(&text_line(&format!(
        "{} \\- {}",
        escape(page.name),
        escape(page.summary)
    )));
    if !page.synopsis.is_empty() {
        out.push_str(".SH SYNOPSIS\n");
        push_lines(&mut out, page.synopsis);
    }
    let mut title_seen = false;
    let mut in_section = false;
    for block in &blocks {
        if let Block::Heading { level: 1, .. } = block {
            if !title_seen {
                title_seen = true;
                continue;
            }
        }
        if !in_section && !matches!(block, Block::Heading { level: 1 | 2, .. }) {
            out.push_str(".SH DESCRIPTION\n");
        }
        in_section = true;
        render_block(&mut out, block);
    }
    if !page.files.is_empty() {
        out.push_str(".SH FILES\n");
        push_lines(&mut out, page.files);
    }
    if !page.see_also.is_empty() {
        out.push_str(".SH SEE ALSO\n");
        let refs: Vec<String> = page
            .see_also
            .iter()
            .map(|r| match r.split_once('(') {
                Some((name, rest)) => format!("\\fB{}\\fR({rest}", escape(name)),
                None => escape(r),
            })
            .collect();
        out.push_str(&text_line(&refs.join(", ")));
    }
    Ok(out)
}

/// Lines set as they are, one a line.
fn push_lines(out: &mut String, lines: &[&str]) {
    out.push_str(".nf\n");
    for line in lines {
        out.push_str(&text_line(&inline(line)));
    }
    out.push_str(".fi\n");
}

/// A text for a quoted macro argument.
fn quoted(s: &str) -> String {
    escape(s).replace('"', "\\(dq")
}

fn render_block(out: &mut String, block: &Block) {
    match block {
        Block::Heading { level, text } => match level {
            1 | 2 => {
                out.push_str(".SH\n");
                out.push_str(&text_line(&inline(&text.to_uppercase())));
            }
            _ => {
                out.push_str(".SS\n");
                out.push_str(&text_line(&inline(text)));
            }
        },
        Block::Paragraph(text) => {
            out.push_str(".PP\n");
            out.push_str(&text_line(&inline(text)));
        }
        Block::List(items) => {
            let mut depth = 0;
            for (item_depth, text) in items {
                while depth < *item_depth {
                    out.push_str(".RS\n");
                    depth += 1;
                }
                while depth > *item_depth {
                    out.push_str(".RE\n");
                    depth -= 1;
                }
                let bullet = if *item_depth == 0 { "\\(bu" } else { "\\(en" };
                let _ = writeln!(out, ".IP {bullet} 2");
                out.push_str(&text_line(&inline(text)));
            }
            while depth > 0 {
                out.push_str(".RE\n");
                depth -= 1;
            }
            out.push_str(".PP\n");
        }
        Block::Table { header, rows } => {
            for row in rows {
                out.push_str(".TP\n");
                out.push_str(&text_line(&inline(&row[0])));
                let last = row.len() - 1;
                for (i, cell) in row.iter().enumerate().skip(1) {
                    if i < last {
                        let label = capitalised(&header[i]);
                        let value = if cell.is_empty() {
                            "none".to_string()
                        } else {
                            inline(cell)
                        };
                        out.push_str(&text_line(&format!("{}: {value}", escape(&label))));
                        out.push_str(".br\n");
                    } else {
                        out.push_str(&text_line(&inline(cell)));
                    }
                }
            }
            out.push_str(".PP\n");
        }
        Block::Code(lines) => {
            out.push_str(".PP\n.RS 4\n.nf\n");
            for line in lines {
                out.push_str(&text_line(&escape(line)));
            }
            out.push_str(".fi\n.RE\n");
        }
    }
}

fn capitalised(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// A line of text: one that would start with a control character (`.` or
/// `'`) is protected with `\&`; an empty one stays a blank line.
fn text_line(text: &str) -> String {
    let text = text.trim_end();
    if text.starts_with('.') || text.starts_with('\'') {
        format!("\\&{text}\n")
    } else {
        format!("{text}\n")
    }
}

/// Text with roff's escape character escaped.
fn escape(s: &str) -> String {
    s.replace('\\', "\\e")
}

/// Text inside a code span: escaped, with hyphens as minus signs (so
/// options copy and search as typed).
fn escape_code(s: &str) -> String {
    escape(s).replace('-', "\\-")
}

/// Inline Markdown to roff: code spans and `**bold**` in bold, `*italic*`
/// in italics, links as their text, backslash escapes resolved.
fn inline(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '`' => {
                if let Some(end) = find(&chars, i + 1, |c| c == '`') {
                    let code: String = chars[i + 1..end].iter().collect();
                    let _ = write!(out, "\\fB{}\\fR", escape_code(&code));
                    i = end + 1;
                    continue;
                }
            }
            '*' if chars.get(i + 1) == Some(&'*') => {
                if let Some(end) = find_pair(&chars, i + 2, '*') {
                    if end > i + 2 {
                        let inner: String = chars[i + 2..end].iter().collect();
                        let _ = write!(out, "\\fB{}\\fR", inline(&inner));
                        i = end + 2;
                        continue;
                    }
                }
            }
            '*' => {
                let opens = chars
                    .get(i + 1)
                    .is_some_and(|n| !n.is_whitespace() && *n != '*');
                if opens {
                    if let Some(end) = find(&chars, i + 1, |c| c == '*' || c == '`') {
                        if chars[end] == '*' && !chars[end - 1].is_whitespace() {
                            let inner: String = chars[i + 1..end].iter().collect();
                            let _ = write!(out, "\\fI{}\\fR", inline(&inner));
                            i = end + 1;
                            continue;
                        }
                    }
                }
            }
            '[' => {
                if let Some(close) = find(&chars, i + 1, |c| c == ']') {
                    if chars.get(close + 1) == Some(&'(') {
                        if let Some(end) = find(&chars, close + 2, |c| c == ')') {
                            let label: String = chars[i + 1..close].iter().collect();
                            out.push_str(&inline(&label));
                            i = end + 1;
                            continue;
                        }
                    }
                }
            }
            '\\' => {
                if let Some(next) = chars.get(i + 1).filter(|n| n.is_ascii_punctuation()) {
                    out.push_str(&escape(&next.to_string()));
                    i += 2;
                    continue;
                }
            }
            _ => {}
        }
        out.push_str(&escape(&c.to_string()));
        i += 1;
    }
    out
}

fn find(chars: &[char], from: usize, pred: impl Fn(char) -> bool) -> Option<usize> {
    (from..chars.len()).find(|&j| pred(chars[j]))
}

/// Where two `c` in a row start, from `from`.
fn find_pair(chars: &[char], from: usize, c: char) -> Option<usize> {
    (from..chars.len().saturating_sub(1)).find(|&j| chars[j] == c && chars[j + 1] == c)
}

/// The list marker of a line: (indent, text after the marker).
fn list_item(line: &str) -> Option<(usize, &str)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let rest = &line[indent..];
    rest.strip_prefix("- ")
        .or_else(|| rest.strip_prefix("* "))
        .map(|text| (indent, text))
}

fn is_fence(line: &str) -> bool {
    line.trim_start().starts_with("```")
}

fn is_heading(line: &str) -> Option<(usize, &str)> {
    let level = line.len() - line.trim_start_matches('#').len();
    if (1..=6).contains(&level) {
        line[level..]
            .strip_prefix(' ')
            .map(|text| (level, text.trim()))
    } else {
        None
    }
}

fn is_table(line: &str) -> bool {
    line.starts_with('|')
}

/// The cells of a `| a | b |` row, with `\|` as a pipe.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|');
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    let mut cells = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                chars.next();
                cells.last_mut().expect("one cell").push('|');
            }
            '|' => cells.push(String::new()),
            c => cells.last_mut().expect("one cell").push(c),
        }
    }
    cells.iter().map(|c| c.trim().to_string()).collect()
}

fn is_rule(line: &str) -> bool {
    let t = line.trim();
    t.starts_with('|') && t.contains('-') && t.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '))
}

fn parse(markdown: &str) -> Result<Vec<Block>, ConvertError> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.trim().is_empty() {
            i += 1;
        } else if is_fence(line) {
            let start = i;
            let end = (i + 1..lines.len())
                .find(|&j| is_fence(lines[j]))
                .ok_or(ConvertError::UnclosedCodeBlock { line: start + 1 })?;
            blocks.push(Block::Code(
                lines[i + 1..end].iter().map(|l| l.to_string()).collect(),
            ));
            i = end + 1;
        } else if let Some((level, text)) = is_heading(line) {
            blocks.push(Block::Heading {
                level,
                text: text.to_string(),
            });
            i += 1;
        } else if is_table(line) {
            let header = cells(line);
            if !lines.get(i + 1).is_some_and(|l| is_rule(l)) {
                return Err(ConvertError::TableWithoutRule { line: i + 1 });
            }
            let mut rows = Vec::new();
            i += 2;
            while i < lines.len() && is_table(lines[i]) {
                let row = cells(lines[i]);
                if row.len() != header.len() {
                    return Err(ConvertError::RaggedTable {
                        line: i + 1,
                        expected: header.len(),
                        found: row.len(),
                    });
                }
                rows.push(row);
                i += 1;
            }
            blocks.push(Block::Table { header, rows });
        } else if list_item(line).is_some_and(|(indent, _)| indent == 0) {
            let mut items: Vec<(usize, String)> = Vec::new();
            // Indents of the open items, outermost first.
            let mut indents: Vec<usize> = Vec::new();
            while i < lines.len() && !lines[i].trim().is_empty() && !is_fence(lines[i]) {
                match list_item(lines[i]) {
                    Some((indent, text)) => {
                        while indents.last().is_some_and(|&open| open > indent) {
                            indents.pop();
                        }
                        if indents.last() != Some(&indent) {
                            indents.push(indent);
                        }
                        items.push((indents.len() - 1, text.trim().to_string()));
                    }
                    None => {
                        let (_, text) = items.last_mut().expect("a list starts with an item");
                        text.push(' ');
                        text.push_str(lines[i].trim());
                    }
                }
                i += 1;
            }
            blocks.push(Block::List(items));
        } else {
            let mut text = String::new();
            while i < lines.len()
                && !lines[i].trim().is_empty()
                && !is_fence(lines[i])
                && is_heading(lines[i]).is_none()
                && !is_table(lines[i])
                && list_item(lines[i]).is_none_or(|(indent, _)| indent != 0)
            {
                if !text.is_empty() {
                    text.push(' ');
                }
                text.push_str(lines[i].trim());
                i += 1;
            }
            blocks.push(Block::Paragraph(text));
        }
    }
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: Page<'static> = Page {
        name: "tool_config",
        section: "5",
        summary: "tool's configuration file",
        source: "skiff 9.9",
        manual: "File Formats",
        synopsis: &["/etc/tool/tool_config"],
        files: &["/etc/tool/tool_config"],
        see_also: &["tool(8)", "sshd_config(5)"],
    };

    fn page(md: &str) -> String {
        render(&PAGE, md).expect("converts")
    }

    #[test]
    fn header_name_and_sections() {
        let out = page("# Tool configuration\n\nIntro text.\n\n## Logging and audit\n\nMore.\n\n### Fine print\n\nSmall.\n");
        assert!(
            out.starts_with(".TH TOOL_CONFIG 5 \"\" \"skiff 9.9\" \"File Formats\"\n"),
            "{out}"
        );
        assert!(
            out.contains(".SH NAME\ntool_config \\- tool's configuration file\n"),
            "{out}"
        );
        assert!(
            out.contains(".SH SYNOPSIS\n.nf\n/etc/tool/tool_config\n.fi\n"),
            "{out}"
        );
        assert!(
            !out.contains("Tool configuration"),
            "the title is the NAME line: {out}"
        );
        assert!(out.contains(".SH DESCRIPTION\n.PP\nIntro text.\n"), "{out}");
        assert!(
            out.contains(".SH\nLOGGING AND AUDIT\n.PP\nMore.\n"),
            "{out}"
        );
        assert!(out.contains(".SS\nFine print\n.PP\nSmall.\n"), "{out}");
        assert!(
            out.ends_with(".SH SEE ALSO\n\\fBtool\\fR(8), \\fBsshd_config\\fR(5)\n"),
            "{out}"
        );
    }

    #[test]
    fn paragraphs_join_lines_and_escape_roff() {
        let out = page("# T\n\n.hidden starts a line,\na \\ backslash and `-o Port=1` code.\n");
        assert!(
            out.contains(
                ".PP\n\\&.hidden starts a line, a \\e backslash and \\fB\\-o Port=1\\fR code.\n"
            ),
            "{out}"
        );
        // A line of its own starting with a quote is protected too.
        let out = page("# T\n\n'quoted' first\n");
        assert!(out.contains("\n\\&'quoted' first\n"), "{out}");
    }

    #[test]
    fn emphasis_links_and_lone_stars() {
        assert_eq!(
            inline("**bold** and *it* here"),
            "\\fBbold\\fR and \\fIit\\fR here"
        );
        assert_eq!(inline("see [the docs](docs/x.md) now"), "see the docs now");
        assert_eq!(inline("a * b and 2*3"), "a * b and 2*3");
        assert_eq!(inline("`a*b` then *c*"), "\\fBa*b\\fR then \\fIc\\fR");
        assert_eq!(inline("no \\*star\\*"), "no *star*");
        assert_eq!(inline("unclosed `tick"), "unclosed `tick");
    }

    #[test]
    fn a_table_row_becomes_a_tagged_paragraph() {
        let md = "# T\n\n| keyword | default | meaning |\n|---|---|---|\n| `AddressFamily any\\|inet` | `any` | which family |\n| `Port N` |  | repeatable |\n";
        let out = page(md);
        assert!(
            out.contains(
                ".TP\n\\fBAddressFamily any|inet\\fR\nDefault: \\fBany\\fR\n.br\nwhich family\n"
            ),
            "{out}"
        );
        assert!(
            out.contains(".TP\n\\fBPort N\\fR\nDefault: none\n.br\nrepeatable\n"),
            "{out}"
        );
    }

    #[test]
    fn nested_lists_open_and_close_their_indents() {
        let md = "# T\n\n- one\n  continued\n  - inner a\n  - inner b\n- two\n\nAfter.\n";
        let out = page(md);
        assert!(
            out.contains(".IP \\(bu 2\none continued\n.RS\n.IP \\(en 2\ninner a\n.IP \\(en 2\ninner b\n.RE\n.IP \\(bu 2\ntwo\n.PP\n.PP\nAfter.\n"),
            "{out}"
        );
    }

    #[test]
    fn code_blocks_keep_their_lines() {
        let out = page("# T\n\n```\n.dot first\n  indented \\n\n```\n");
        assert!(
            out.contains(".PP\n.RS 4\n.nf\n\\&.dot first\n  indented \\en\n.fi\n.RE\n"),
            "{out}"
        );
    }

    #[test]
    fn malformed_markdown_is_an_error_naming_the_line() {
        assert_eq!(
            render(&PAGE, "# T\n\ntext\n```\ncode\n"),
            Err(ConvertError::UnclosedCodeBlock { line: 4 })
        );
        assert_eq!(
            render(&PAGE, "| a | b |\n|---|---|\n| 1 | 2 |\n| 1 | 2 | 3 |\n"),
            Err(ConvertError::RaggedTable {
                line: 4,
                expected: 2,
                found: 3
            })
        );
        assert_eq!(
            render(&PAGE, "text\n\n| a | b |\n| 1 | 2 |\n"),
            Err(ConvertError::TableWithoutRule { line: 3 })
        );
    }

    /// The reference page the package's skiffd_config(5) is made from
    /// converts, with every keyword of its tables as a tag and every
    /// indent closed.
    #[test]
    fn the_configuration_reference_converts() {
        let md = include_str!("../../../docs/skiffd-config.md");
        let out = page(md);
        for keyword in ["ListenAddress", "UsePAM", "PAMServiceName", "HostKey FILE"] {
            assert!(
                out.contains(&format!(".TP\n\\fB{keyword}")),
                "{keyword} tag"
            );
        }
        assert_eq!(out.matches("\n.RS").count(), out.matches("\n.RE").count());
        assert_eq!(
            out.matches("\n.nf\n").count(),
            out.matches("\n.fi\n").count()
        );
        assert!(out.contains(".SH\nPAM\n"), "PAM section");
        const MACROS: [&str; 11] = [
            ".TH", ".SH", ".SS", ".PP", ".TP", ".IP", ".RS", ".RE", ".nf", ".fi", ".br",
        ];
        for line in out.lines().filter(|l| l.starts_with('.')) {
            let name = line.split_whitespace().next().unwrap_or_default();
            assert!(MACROS.contains(&name), "text read as a request: {line}");
        }
    }
}
