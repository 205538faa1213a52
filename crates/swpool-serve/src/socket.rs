//! Chunks over a Unix socket: the node's on-demand server process (an MPI rank, which fetches from
//! peers and shared storage and hashes every chunk against the manifest before it answers) hands
//! chunks to the node's `sw-pool-serve`, which serves them over FUSE. The socket lies in the
//! user's private state directory; the serving side checks that the peer is the same user, and the
//! client names the manifest digest it serves when it connects: only a server of the same pool
//! answers, so the client need not hash the chunks again ([`ChunkSource::verified`]; a second hash
//! cost 15 % of sw-pool-serve's CPU on every node).
//!
//! Protocol (little endian). An answer is a [`crate::frame`]: the chunk's bytes, or a message
//! (UTF-8, at most 4096 bytes here: what went wrong, named by the serving side). On connecting, the
//! client sends [`HELLO`], `len: u16` and the digest (at most 256 bytes); the server answers with
//! no bytes (the same digest) or a message, and then closes. Then each request is `offset: u64,
//! len: u32`, answered with the chunk's bytes or why they could not be had.

use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::chunks::Chunks;
use crate::frame::{Answer, HEAD};
use crate::source::ChunkSource;

/// The longest answer accepted (a chunk is at most 1 GiB; messages are short).
pub const MAX_ANSWER: u32 = 1 << 30;
/// What a client sends first, before the digest it serves.
pub const HELLO: &[u8; 8] = b"swpool1\0";
const MAX_DIGEST: usize = 256;
/// The longest message an answer carries.
const MAX_MESSAGE: usize = 4096;

/// Send one answer: `bytes`, or the message (cut to [`MAX_MESSAGE`] bytes).
fn send(s: &mut UnixStream, r: Result<&[u8], &str>) -> io::Result<()> {
    let (answer, body) = match r {
        Ok(b) => (Answer::Chunk(b.len() as u32), b),
        Err(m) => {
            let b = &m.as_bytes()[..m.len().min(MAX_MESSAGE)];
            (Answer::Message(b.len() as u32), b)
        }
    };
    s.write_all(&answer.head())?;
    s.write_all(body)
}

/// Receive one answer into `buf`, whose length is what was asked for; a message is an error.
fn receive(s: &mut UnixStream, buf: &mut [u8]) -> io::Result<()> {
    let mut head = [0u8; HEAD];
    s.read_exact(&mut head)?;
    match Answer::parse(&head) {
        Answer::Chunk(len) if len as usize == buf.len() => s.read_exact(buf),
        Answer::Chunk(len) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("answer of {len} bytes for a request of {}", buf.len()),
        )),
        Answer::Message(len) if len as usize <= MAX_MESSAGE => {
            let mut m = vec![0u8; len as usize];
            s.read_exact(&mut m)?;
            Err(io::Error::other(String::from_utf8_lossy(&m).into_owned()))
        }
        Answer::Message(_) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "an error message longer than 4096 bytes",
        )),
    }
}

/// A [`ChunkSource`] that asks the node's on-demand server through its socket.
pub struct UnixSource {
    path: PathBuf,
    /// How long one answer may take (then the read fails: `EIO`, not a hang).
    stall: Duration,
    /// The manifest digest this client serves: the server must serve the same.
    digest: String,
    idle: Mutex<Vec<UnixStream>>,
}

impl UnixSource {
    pub fn new(path: &Path, stall: Duration, digest: &str) -> UnixSource {
        UnixSource {
            path: path.to_path_buf(),
            stall,
            digest: digest.to_string(),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// A new connection, greeted (the server serves the same digest).
    pub fn connect(&self) -> io::Result<UnixStream> {
        let mut s = UnixStream::connect(&self.path)?;
        s.set_read_timeout(Some(self.stall))?;
        s.set_write_timeout(Some(self.stall))?;
        let d = self.digest.as_bytes();
        let mut hello = HELLO.to_vec();
        hello.extend_from_slice(&(d.len().min(MAX_DIGEST) as u16).to_le_bytes());
        hello.extend_from_slice(&d[..d.len().min(MAX_DIGEST)]);
        s.write_all(&hello)?;
        receive(&mut s, &mut [])?;
        Ok(s)
    }
}

/// Ask a greeted connection ([`UnixSource::connect`]) for `buf.len()` bytes at `offset`.
pub fn ask(s: &mut UnixStream, offset: u64, buf: &mut [u8]) -> io::Result<()> {
    let mut req = [0u8; 12];
    req[..8].copy_from_slice(&offset.to_le_bytes());
    req[8..].copy_from_slice(&(buf.len() as u32).to_le_bytes());
    s.write_all(&req)?;
    receive(s, buf)
}

impl ChunkSource for UnixSource {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if buf.len() as u64 > MAX_ANSWER as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "chunk too large",
            ));
        }
        let pooled = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut s = match pooled {
            Some(s) => s,
            None => self.connect()?,
        };
        let r = ask(&mut s, offset, buf);
        if r.is_ok() {
            self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(s);
        } else if let Err(e) = &r {
            if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no answer from the node's on-demand server within {} s",
                        self.stall.as_secs()
                    ),
                ));
            }
        }
        r
    }
    fn describe(&self) -> String {
        format!("the node's on-demand server ({})", self.path.display())
    }
    fn verified(&self) -> bool {
        true
    }
}

/// What a socket serves: bytes at offsets of one image, named by a digest its clients must name.
pub trait Served: Send + Sync {
    /// What a client must name when it connects.
    fn digest(&self) -> &str;
    /// `len` bytes at `offset`, or why not (a message for the client).
    fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>, String>;
    /// A client connected (`true`) or its connection ended (`false`).
    fn connection(&self, _open: bool) {}
}

impl Served for Chunks {
    fn digest(&self) -> &str {
        Chunks::digest(self)
    }
    fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>, String> {
        Chunks::read(self, offset, len).map_err(|e| e.to_string())
    }
}

/// Serve `chunks` on `listener` to processes of this user until the listener fails; one thread per
/// connection.
pub fn serve<S: Served + ?Sized + 'static>(listener: UnixListener, chunks: Arc<S>) {
    let me = rustix::process::geteuid();
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let theirs = rustix::net::sockopt::get_socket_peercred(&conn).map(|c| c.uid);
        if theirs.ok() != Some(me) {
            continue; // not this user's: dropped unanswered
        }
        let c = chunks.clone();
        std::thread::spawn(move || {
            c.connection(true);
            let _ = answer(conn, &*c);
            c.connection(false);
        });
    }
}

fn answer<S: Served + ?Sized>(mut s: UnixStream, chunks: &S) -> io::Result<()> {
    // the client's digest first: only a client of the same pool is answered
    let mut hello = [0u8; 10];
    s.read_exact(&mut hello)?;
    let len = u16::from_le_bytes([hello[8], hello[9]]) as usize;
    if &hello[..8] != HELLO || len > MAX_DIGEST {
        return send(&mut s, Err("not a sw-pool-serve client"));
    }
    let mut digest = vec![0u8; len];
    s.read_exact(&mut digest)?;
    if digest != chunks.digest().as_bytes() {
        let m = format!(
            "this server serves {}, not {}",
            chunks.digest(),
            String::from_utf8_lossy(&digest)
        );
        return send(&mut s, Err(&m));
    }
    send(&mut s, Ok(&[]))?;
    loop {
        let mut req = [0u8; 12];
        match s.read_exact(&mut req) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let offset = u64::from_le_bytes(req[..8].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(req[8..].try_into().expect("4 bytes"));
        let r = if len > MAX_ANSWER {
            Err(format!("request of {len} bytes refused"))
        } else {
            chunks.read(offset, len).and_then(|v| {
                if v.len() == len as usize {
                    Ok(v)
                } else {
                    Err(format!("{} bytes at {offset}: past the end", len))
                }
            })
        };
        send(&mut s, r.as_deref().map_err(String::as_str))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunks::Limits;
    use crate::source::FileSource;

    #[test]
    fn chunks_cross_the_socket_and_errors_name_their_cause() {
        let d = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i % 251) as u8 + 1).collect();
        let mut m = swpool_format::pool::manifest::sample(&data, 4096);
        let f = d.path().join("img");
        std::fs::write(&f, &data).unwrap();
        // chunk 1 of the manifest says other bytes: the serving side refuses it
        let mut other = data.clone();
        other[4096] ^= 1;
        m.chunks[1] = Some(hex::encode(swpool_format::pool::manifest::hash_chunk(
            &other[4096..8192],
        )));
        let src = FileSource::new(std::fs::File::open(&f).unwrap(), &f);
        let chunks = Arc::new(Chunks::new(
            &m,
            Box::new(src),
            None,
            Limits::default(),
            "n1",
        ));
        let sock = d.path().join("s");
        let l = UnixListener::bind(&sock).unwrap();
        std::thread::spawn(move || serve(l, chunks));
        // a client of another pool is refused by name
        let other = UnixSource::new(&sock, Duration::from_secs(5), "blake3:other");
        let mut b = vec![0u8; 4096];
        let e = other.read_at(0, &mut b).unwrap_err().to_string();
        assert!(e.contains("not blake3:other"), "{e}");
        let u = UnixSource::new(&sock, Duration::from_secs(5), &m.digest);
        assert!(u.verified());
        let mut b = vec![0u8; 4096];
        u.read_at(0, &mut b).unwrap();
        assert_eq!(b, &data[..4096]);
        u.read_at(2 * 4096, &mut b).unwrap();
        assert_eq!(b, &data[8192..12288]);
        let e = u.read_at(4096, &mut b).unwrap_err().to_string();
        assert!(e.contains("chunk 1") && e.contains("n1"), "{e}");
        // the connection is still usable after an error answer
        let mut t = vec![0u8; 100];
        u.read_at(3 * 4096, &mut t).unwrap();
        assert_eq!(t, &data[12288..]);
    }
}
