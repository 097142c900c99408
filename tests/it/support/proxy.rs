//! A fault-injecting TCP proxy for the remote fault tests: sits between ckpt and an S3 server on
//! loopback, passes bytes through, and on demand cuts or stalls connections once they have carried
//! a number of bytes in one direction (mid-upload: client → server; mid-download: server →
//! client). It also reads the HTTP/1.1 requests going through (request line, `Content-Length`
//! body skipped), so a test can count what a command sent.
//!
//! Plain `std::net` and threads: a thread per direction of each connection. A stalled direction
//! holds its sockets until the fault is released or the proxy dropped, and at most
//! [`MAX_STALL`], so a test that fails cannot leave threads behind for long.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest a stalled connection is held.
pub const MAX_STALL: Duration = Duration::from_secs(60);

/// Which way bytes flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Client to server: request lines, headers and uploaded bodies.
    Up,
    /// Server to client: answers and downloaded bodies.
    Down,
}

/// What the proxy does to the connections that reach a threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Nothing: every byte passes.
    Pass,
    /// Once a connection has carried more than `after` bytes in `direction`, both of its sockets
    /// are shut down (the bytes that crossed the threshold are not forwarded).
    Drop {
        /// The direction counted.
        direction: Direction,
        /// Bytes that pass first.
        after: usize,
    },
    /// As `Drop`, but the connection is held open and silent instead.
    Stall {
        /// The direction counted.
        direction: Direction,
        /// Bytes that pass first.
        after: usize,
    },
    /// The request whose line starts with `method` and contains `path` reaches the server
    /// whole, but the connection is cut when the answer comes back: the server did the work,
    /// the client cannot know it.
    LoseAnswer {
        /// `PUT`, `GET`, ...
        method: &'static str,
        /// A part of the request's path.
        path: &'static str,
    },
}

#[derive(Debug)]
struct State {
    upstream: Mutex<u16>,
    fault: Mutex<Fault>,
    /// Connections the fault may still hit (each hit takes one).
    hits_left: AtomicUsize,
    /// Connections hit so far.
    hits: AtomicUsize,
    /// Request lines seen (`PUT /bucket/key HTTP/1.1`), in order of arrival.
    requests: Mutex<Vec<String>>,
    /// Bytes passed from the server to the client so far.
    down: AtomicU64,
    /// Bytes passed from the client to the server so far.
    up: AtomicU64,
    /// Set to let stalled connections go (they are then closed).
    released: AtomicBool,
    stopped: AtomicBool,
}

/// A running proxy; stops accepting and releases its stalls when dropped.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    state: Arc<State>,
}

impl Proxy {
    /// A pass-through proxy on a free loopback port to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State {
            upstream: Mutex::new(upstream),
            fault: Mutex::new(Fault::Pass),
            hits_left: AtomicUsize::new(0),
            hits: AtomicUsize::new(0),
            requests: Mutex::new(Vec::new()),
            down: AtomicU64::new(0),
            up: AtomicU64::new(0),
            released: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
        });
        let shared = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if shared.stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let upstream = *shared.upstream.lock().unwrap();
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    // The server is down: the client sees its connection closed, as it would
                    // see a refused connection through a load balancer.
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let conn = Arc::new(Conn::default());
                for direction in [Direction::Up, Direction::Down] {
                    let (from, to) = match direction {
                        Direction::Up => (client.try_clone(), server.try_clone()),
                        Direction::Down => (server.try_clone(), client.try_clone()),
                    };
                    let (Ok(from), Ok(to)) = (from, to) else { continue };
                    let (state, conn) = (shared.clone(), conn.clone());
                    std::thread::spawn(move || forward(&state, direction, from, to, &conn));
                }
            }
        });
        Proxy { port, state }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The endpoint URL of the proxy (`AWS_ENDPOINT_URL`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// From now on, applies `fault` to the next `times` connections that reach its threshold.
    pub fn set(&self, fault: Fault, times: usize) {
        self.state.released.store(false, Ordering::SeqCst);
        *self.state.fault.lock().unwrap() = fault;
        self.state.hits_left.store(times, Ordering::SeqCst);
    }

    /// Back to pass-through; stalled connections are let go (closed).
    pub fn clear(&self) {
        self.set(Fault::Pass, 0);
        self.state.released.store(true, Ordering::SeqCst);
    }

    /// Connections the faults have hit so far.
    pub fn hits(&self) -> usize {
        self.state.hits.load(Ordering::SeqCst)
    }

    /// Request lines seen so far.
    pub fn requests(&self) -> Vec<String> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Bytes passed from the server to the client so far (answers and downloads).
    pub fn bytes_down(&self) -> u64 {
        self.state.down.load(Ordering::SeqCst)
    }

    /// Bytes passed from the client to the server so far (requests and uploads).
    pub fn bytes_up(&self) -> u64 {
        self.state.up.load(Ordering::SeqCst)
    }

    /// Forgets the requests seen so far.
    pub fn reset_requests(&self) {
        self.state.requests.lock().unwrap().clear();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        self.state.released.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees `stopped`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// What the two directions of one connection share.
#[derive(Default)]
struct Conn {
    /// A fault hit this connection: both directions stop.
    cut: AtomicBool,
    /// The next answer on this connection is to be lost ([`Fault::LoseAnswer`]).
    lose_answer: AtomicBool,
}

impl State {
    /// Takes one of the fault's hits, if any is left.
    fn take_hit(&self) -> bool {
        let taken = self.hits_left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(1)).is_ok();
        if taken {
            self.hits.fetch_add(1, Ordering::SeqCst);
        }
        taken
    }
}

/// Copies `from` to `to`, applying the fault to this direction; shuts both down at the end.
fn forward(state: &State, direction: Direction, mut from: TcpStream, mut to: TcpStream, conn: &Conn) {
    let mut requests = RequestReader::default();
    let mut carried = 0usize;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if conn.cut.load(Ordering::SeqCst) {
            break; // the other direction was cut
        }
        if direction == Direction::Down && conn.lose_answer.load(Ordering::SeqCst) {
            conn.cut.store(true, Ordering::SeqCst);
            break;
        }
        carried += n;
        let fault = *state.fault.lock().unwrap();
        let (stall, after) = match fault {
            Fault::Drop { direction: d, after } if d == direction => (false, after),
            Fault::Stall { direction: d, after } if d == direction => (true, after),
            _ => (false, usize::MAX),
        };
        // What fits under the threshold still goes through, so a cut lands mid-message.
        let pass = if carried > after && state.take_hit() { n - (carried - after).min(n) } else { n };
        if direction == Direction::Up {
            for line in requests.feed(&buf[..pass], &state.requests) {
                if let Fault::LoseAnswer { method, path } = fault {
                    if line.starts_with(method) && line.contains(path) && state.take_hit() {
                        conn.lose_answer.store(true, Ordering::SeqCst);
                    }
                }
            }
        }
        let written = to.write_all(&buf[..pass]);
        if written.is_ok() {
            let counter = if direction == Direction::Down { &state.down } else { &state.up };
            counter.fetch_add(pass as u64, Ordering::SeqCst);
        }
        if pass < n {
            conn.cut.store(true, Ordering::SeqCst);
            if stall {
                let start = Instant::now();
                while !state.released.load(Ordering::SeqCst) && start.elapsed() < MAX_STALL {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            break;
        }
        if written.is_err() {
            break;
        }
    }
    if conn.cut.load(Ordering::SeqCst) {
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    } else {
        let _ = to.shutdown(Shutdown::Write);
    }
}

/// Finds the request lines in a client's byte stream: headers up to the blank line, then
/// `Content-Length` bytes of body. A chunked body (object_store sends none) stops the count
/// for the rest of that connection, with a marker line.
#[derive(Default)]
struct RequestReader {
    head: Vec<u8>,
    body_left: usize,
    lost: bool,
}

impl RequestReader {
    /// Reads `bytes`; records the request lines they complete in `out` and returns them.
    fn feed(&mut self, mut bytes: &[u8], out: &Mutex<Vec<String>>) -> Vec<String> {
        let mut lines_seen = Vec::new();
        while !bytes.is_empty() && !self.lost {
            if self.body_left > 0 {
                let skip = self.body_left.min(bytes.len());
                self.body_left -= skip;
                bytes = &bytes[skip..];
                continue;
            }
            self.head.push(bytes[0]);
            bytes = &bytes[1..];
            if !self.head.ends_with(b"\r\n\r\n") {
                if self.head.len() > 64 << 10 {
                    self.lost = true;
                    out.lock().unwrap().push("(unparsable request head)".into());
                }
                continue;
            }
            let head = String::from_utf8_lossy(&self.head).into_owned();
            self.head.clear();
            let mut lines = head.split("\r\n");
            let line = lines.next().unwrap_or_default().to_string();
            for header in lines {
                let Some((name, value)) = header.split_once(':') else { continue };
                if name.eq_ignore_ascii_case("content-length") {
                    self.body_left = value.trim().parse().unwrap_or(0);
                } else if name.eq_ignore_ascii_case("transfer-encoding") && value.contains("chunked") {
                    self.lost = true;
                }
            }
            let mut out = out.lock().unwrap();
            out.push(line.clone());
            if self.lost {
                out.push("(chunked body: later requests on this connection not counted)".into());
            }
            lines_seen.push(line);
        }
        lines_seen
    }
}
