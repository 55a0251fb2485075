//! A test peer: a hostile SFTP version 3 server on stdin/stdout, for the
//! tests in `tests/hostile_server.rs` that prove `skiff cp` over SFTP trusts
//! nothing a server says about what to write.
//!
//! skiffd runs it as its `sftp` subsystem (`Subsystem sftp 'PATH' SCENARIO`,
//! with `DataPlane no` so `skiff cp` takes SFTP). It serves a small tree held
//! in memory, chosen by SCENARIO, and speaks just enough of the protocol
//! (draft-ietf-secsh-filexfer-02) for a download: INIT/VERSION (no
//! extensions), REALPATH, STAT/LSTAT/FSTAT, OPENDIR/READDIR/CLOSE and
//! OPEN/READ/CLOSE; every other request gets a STATUS failure. Paths are
//! taken relative to the tree's root whether or not they start with `/`.
//!
//! Scenarios:
//! - `dup-names`: directory `tree` whose listing names `a` twice (with
//!   different contents).
//! - `setuid`: `report.txt` (and `tree/report.txt`) whose mode is 0o104755.
//! - `chmod-existing`: `tree` claims mode 0o777 and another mtime, with a
//!   new directory `tree/new` (0o750) and files.
//! - `oversize-read`: `report.txt` is 10 bytes by STAT, and every READ
//!   below that answers with 10 bytes more than asked for.
//! - `escapes`: `report.txt` exists by STAT, but opening it fails with a
//!   message that steers the terminal.

use std::collections::HashMap;
use std::io::{self, Read, Write};

/// What a terminal takes as "move up a line and erase it".
const ERASE_LINE: &str = "\x1b[1A\x1b[2K";

/// The modification time the server claims.
const CLAIMED_MTIME: u32 = 1_234_567_890;

// Packet types.
const FXP_INIT: u8 = 1;
const FXP_VERSION: u8 = 2;
const FXP_OPEN: u8 = 3;
const FXP_CLOSE: u8 = 4;
const FXP_READ: u8 = 5;
const FXP_LSTAT: u8 = 7;
const FXP_FSTAT: u8 = 8;
const FXP_OPENDIR: u8 = 11;
const FXP_READDIR: u8 = 12;
const FXP_REALPATH: u8 = 16;
const FXP_STAT: u8 = 17;
const FXP_STATUS: u8 = 101;
const FXP_HANDLE: u8 = 102;
const FXP_DATA: u8 = 103;
const FXP_NAME: u8 = 104;
const FXP_ATTRS: u8 = 105;

// Status codes.
const FX_OK: u32 = 0;
const FX_EOF: u32 = 1;
const FX_NO_SUCH_FILE: u32 = 2;
const FX_FAILURE: u32 = 4;
const FX_OP_UNSUPPORTED: u32 = 8;

// Attribute flags.
const ATTR_SIZE: u32 = 0x1;
const ATTR_PERMISSIONS: u32 = 0x4;
const ATTR_ACMODTIME: u32 = 0x8;

const S_IFREG: u32 = 0o100000;
const S_IFDIR: u32 = 0o040000;

/// A node of the served tree.
#[derive(Clone)]
enum Node {
    File {
        /// What STAT says the size is.
        size: u64,
        bytes: Vec<u8>,
        mode: u32,
    },
    Dir {
        mode: u32,
        /// Names as the listing gives them (duplicates allowed).
        names: Vec<String>,
    },
}

impl Node {
    fn file(bytes: &[u8], mode: u32) -> Node {
        Node::File {
            size: bytes.len() as u64,
            bytes: bytes.to_vec(),
            mode: S_IFREG | mode,
        }
    }

    fn dir(mode: u32, names: &[&str]) -> Node {
        Node::Dir {
            mode: S_IFDIR | mode,
            names: names.iter().map(|n| n.to_string()).collect(),
        }
    }
}

/// The tree and the ways the scenario bends the protocol.
struct Tree {
    nodes: HashMap<String, Node>,
    /// READ answers with this many bytes more than asked for.
    read_extra: usize,
    /// OPEN of these paths fails with this message.
    open_fails: Option<(String, String)>,
    /// For `dup-names`: what each listed `a` holds, in listing order.
    dup_contents: Vec<Vec<u8>>,
}

fn tree_for(scenario: &str) -> Option<Tree> {
    let mut nodes = HashMap::new();
    let mut t = Tree {
        nodes: HashMap::new(),
        read_extra: 0,
        open_fails: None,
        dup_contents: Vec::new(),
    };
    nodes.insert(String::new(), Node::dir(0o755, &["report.txt", "tree"]));
    match scenario {
        "dup-names" => {
            nodes.insert("tree".into(), Node::dir(0o755, &["a", "a"]));
            nodes.insert("tree/a".into(), Node::file(b"first a\n", 0o644));
            t.dup_contents = vec![b"first a\n".to_vec(), b"second a, longer\n".to_vec()];
        }
        "setuid" => {
            nodes.insert("report.txt".into(), Node::file(b"#!/bin/sh\nid\n", 0o4755));
            nodes.insert("tree".into(), Node::dir(0o1777, &["report.txt"]));
            nodes.insert(
                "tree/report.txt".into(),
                Node::file(b"#!/bin/sh\nid\n", 0o6755),
            );
        }
        "chmod-existing" => {
            nodes.insert("tree".into(), Node::dir(0o777, &["new", "top.txt"]));
            nodes.insert("tree/top.txt".into(), Node::file(b"top\n", 0o644));
            nodes.insert("tree/new".into(), Node::dir(0o750, &["inner.txt"]));
            nodes.insert("tree/new/inner.txt".into(), Node::file(b"inner\n", 0o640));
        }
        "oversize-read" => {
            nodes.insert(
                "report.txt".into(),
                Node::File {
                    size: 10,
                    bytes: b"0123456789".to_vec(),
                    mode: S_IFREG | 0o644,
                },
            );
            t.read_extra = 10;
        }
        "escapes" => {
            nodes.insert("report.txt".into(), Node::file(b"secret\n", 0o644));
            t.open_fails = Some((
                "report.txt".into(),
                format!("{ERASE_LINE}skiff: copied 1 file\r{ERASE_LINE}"),
            ));
        }
        _ => return None,
    }
    t.nodes = nodes;
    Some(t)
}

/// A path as the tree keys it: no leading `/`, no `.` components.
fn key(path: &str) -> String {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect::<Vec<_>>()
        .join("/")
}

/// What a handle refers to.
enum Handle {
    File {
        path: String,
        /// For `dup-names`: which of the listed `a`s this is.
        dup: Option<usize>,
    },
    Dir {
        path: String,
        listed: bool,
    },
}

/// Reads fields off a request.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn u32(&mut self) -> Option<u32> {
        let (head, rest) = self.0.split_at_checked(4)?;
        self.0 = rest;
        Some(u32::from_be_bytes(head.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        let (head, rest) = self.0.split_at_checked(8)?;
        self.0 = rest;
        Some(u64::from_be_bytes(head.try_into().ok()?))
    }

    fn string(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        let (s, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(String::from_utf8_lossy(s).into_owned())
    }
}

/// Builds a reply packet.
struct Reply(Vec<u8>);

impl Reply {
    fn new(kind: u8) -> Reply {
        Reply(vec![0, 0, 0, 0, kind])
    }

    fn u32(mut self, v: u32) -> Reply {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    fn u64(mut self, v: u64) -> Reply {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    fn bytes(self, b: &[u8]) -> Reply {
        let mut r = self.u32(b.len() as u32);
        r.0.extend_from_slice(b);
        r
    }

    fn string(self, s: &str) -> Reply {
        self.bytes(s.as_bytes())
    }

    fn attrs(self, node: &Node) -> Reply {
        let (size, mode) = match node {
            Node::File { size, mode, .. } => (*size, *mode),
            Node::Dir { mode, .. } => (4096, *mode),
        };
        self.u32(ATTR_SIZE | ATTR_PERMISSIONS | ATTR_ACMODTIME)
            .u64(size)
            .u32(mode)
            .u32(CLAIMED_MTIME)
            .u32(CLAIMED_MTIME)
    }

    fn finish(mut self) -> Vec<u8> {
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_be_bytes());
        self.0
    }
}

fn status(id: u32, code: u32, message: &str) -> Vec<u8> {
    Reply::new(FXP_STATUS)
        .u32(id)
        .u32(code)
        .string(message)
        .string("en")
        .finish()
}

struct Server {
    tree: Tree,
    handles: HashMap<String, Handle>,
    next_handle: u32,
    /// For `dup-names`: how many times `tree/a` was opened.
    dup_opens: usize,
}

impl Server {
    fn handle(&mut self, h: Handle) -> String {
        self.next_handle += 1;
        let name = format!("h{}", self.next_handle);
        self.handles.insert(name.clone(), h);
        name
    }

    fn node(&self, path: &str) -> Option<&Node> {
        self.tree.nodes.get(&key(path))
    }

    /// The answer to one request (`kind`, then `body` after the type byte).
    fn answer(&mut self, kind: u8, body: &[u8]) -> Option<Vec<u8>> {
        let mut f = Fields(body);
        if kind == FXP_INIT {
            return Some(Reply::new(FXP_VERSION).u32(3).finish());
        }
        let id = f.u32()?;
        Some(match kind {
            FXP_REALPATH => {
                let path = format!("/{}", key(&f.string()?));
                Reply::new(FXP_NAME)
                    .u32(id)
                    .u32(1)
                    .string(&path)
                    .string(&path)
                    .u32(0)
                    .finish()
            }
            FXP_STAT | FXP_LSTAT => match self.node(&f.string()?) {
                Some(n) => Reply::new(FXP_ATTRS).u32(id).attrs(n).finish(),
                None => status(id, FX_NO_SUCH_FILE, "No such file"),
            },
            FXP_FSTAT => {
                let h = f.string()?;
                let node = match self.handles.get(&h) {
                    Some(Handle::File { path, .. }) | Some(Handle::Dir { path, .. }) => {
                        self.node(path).cloned()
                    }
                    None => None,
                };
                match node {
                    Some(n) => Reply::new(FXP_ATTRS).u32(id).attrs(&n).finish(),
                    None => status(id, FX_FAILURE, "bad handle"),
                }
            }
            FXP_OPEN => {
                let path = key(&f.string()?);
                if let Some((failing, message)) = &self.tree.open_fails {
                    if *failing == path {
                        return Some(status(id, FX_FAILURE, message));
                    }
                }
                match self.node(&path) {
                    Some(Node::File { .. }) => {
                        let dup = (!self.tree.dup_contents.is_empty()).then(|| {
                            self.dup_opens += 1;
                            (self.dup_opens - 1).min(self.tree.dup_contents.len() - 1)
                        });
                        let h = self.handle(Handle::File { path, dup });
                        Reply::new(FXP_HANDLE).u32(id).string(&h).finish()
                    }
                    Some(Node::Dir { .. }) => status(id, FX_FAILURE, "Is a directory"),
                    None => status(id, FX_NO_SUCH_FILE, "No such file"),
                }
            }
            FXP_OPENDIR => {
                let path = key(&f.string()?);
                match self.node(&path) {
                    Some(Node::Dir { .. }) => {
                        let h = self.handle(Handle::Dir {
                            path,
                            listed: false,
                        });
                        Reply::new(FXP_HANDLE).u32(id).string(&h).finish()
                    }
                    Some(_) => status(id, FX_FAILURE, "Not a directory"),
                    None => status(id, FX_NO_SUCH_FILE, "No such file"),
                }
            }
            FXP_READDIR => {
                let h = f.string()?;
                let Some(Handle::Dir { path, listed }) = self.handles.get_mut(&h) else {
                    return Some(status(id, FX_FAILURE, "bad handle"));
                };
                if *listed {
                    return Some(status(id, FX_EOF, "End of directory"));
                }
                *listed = true;
                let path = path.clone();
                let Some(Node::Dir { names, .. }) = self.node(&path).cloned() else {
                    return Some(status(id, FX_FAILURE, "gone"));
                };
                let mut reply = Reply::new(FXP_NAME).u32(id).u32(names.len() as u32);
                for name in &names {
                    let child = if path.is_empty() {
                        name.clone()
                    } else {
                        format!("{path}/{name}")
                    };
                    let node = self.node(&child).cloned().unwrap_or(Node::file(b"", 0o644));
                    reply = reply.string(name).string(name).attrs(&node);
                }
                reply.finish()
            }
            FXP_READ => {
                let h = f.string()?;
                let (offset, len) = (f.u64()?, f.u32()? as usize);
                let Some(Handle::File { path, dup }) = self.handles.get(&h) else {
                    return Some(status(id, FX_FAILURE, "bad handle"));
                };
                let (size, bytes) = match (self.node(path), dup) {
                    (_, Some(i)) => {
                        let b = self.tree.dup_contents[*i].clone();
                        (b.len() as u64, b)
                    }
                    (Some(Node::File { size, bytes, .. }), None) => (*size, bytes.clone()),
                    _ => return Some(status(id, FX_FAILURE, "gone")),
                };
                if offset >= size {
                    return Some(status(id, FX_EOF, "End of file"));
                }
                let want = len + self.tree.read_extra;
                let start = offset as usize;
                let mut data: Vec<u8> = bytes.get(start..).unwrap_or(&[]).to_vec();
                // Past the real bytes (only when lying), repeat a pattern.
                data.resize(data.len().max(want), b'!');
                data.truncate(want);
                if self.tree.read_extra == 0 {
                    data.truncate(bytes.len().saturating_sub(start).min(len));
                }
                Reply::new(FXP_DATA).u32(id).bytes(&data).finish()
            }
            FXP_CLOSE => {
                let h = f.string()?;
                match self.handles.remove(&h) {
                    Some(_) => status(id, FX_OK, "Success"),
                    None => status(id, FX_FAILURE, "bad handle"),
                }
            }
            _ => status(id, FX_OP_UNSUPPORTED, "Operation unsupported"),
        })
    }
}

fn main() {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    let Some(tree) = tree_for(&scenario) else {
        eprintln!("hostile_sftp: unknown scenario {scenario:?}");
        std::process::exit(2);
    };
    let mut server = Server {
        tree,
        handles: HashMap::new(),
        next_handle: 0,
        dup_opens: 0,
    };
    let mut stdin = io::stdin().lock();
    let mut stdout = io::stdout().lock();
    loop {
        let mut len = [0u8; 4];
        if stdin.read_exact(&mut len).is_err() {
            return;
        }
        let len = u32::from_be_bytes(len) as usize;
        if len == 0 || len > 1 << 20 {
            return;
        }
        let mut packet = vec![0u8; len];
        if stdin.read_exact(&mut packet).is_err() {
            return;
        }
        let reply = match server.answer(packet[0], &packet[1..]) {
            Some(r) => r,
            // A request too short for its fields: answer if it had an id.
            None => match Fields(&packet[1..]).u32() {
                Some(id) => status(id, FX_FAILURE, "bad request"),
                None => return,
            },
        };
        if stdout
            .write_all(&reply)
            .and_then(|_| stdout.flush())
            .is_err()
        {
            return;
        }
    }
}
