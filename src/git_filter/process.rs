//! git's long-running filter protocol, version 2 (gitattributes(5), "Long Running Filter
//! Process"; Documentation/technical/long-running-process-protocol.txt): the handshake, then
//! one `clean` or `smudge` request after another over pkt-lines until git closes the pipe.
//!
//! The server streams: a request's content reaches the [`Filter`] as a [`Read`] over its
//! packets and its answer leaves through a [`Write`] that sends `status=success` before the
//! first byte, so neither side is ever held whole here. A filter error answers `status=error`
//! for that file (after draining the rest of its content, so the stream stays in step) and the
//! server goes on; a protocol violation ends [`serve`] with an error naming it.

use super::pktline::{self, Packet, PacketReader, MAX_DATA};
use std::io::{self, Read, Write};

/// What git asks of a filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Working tree → repository.
    Clean,
    /// Repository → working tree.
    Smudge,
}

/// Why a [`Filter`] failed on one file: reported to git as `status=error` and its message
/// (with its causes) to stderr.
pub type FilterError = Box<dyn std::error::Error + Send + Sync>;

/// A filter: turns one file's content into its filtered form.
pub trait Filter {
    /// Filters the content read from `input` (the file at `path`, relative to the working
    /// tree) into `output`. An error is reported to git as `status=error` for this file; its
    /// message goes to stderr.
    fn filter(
        &mut self,
        command: Command,
        path: &str,
        input: &mut dyn Read,
        output: &mut dyn Write,
    ) -> Result<(), FilterError>;

    /// What git says about the request [`Filter::filter`] is called for next, besides its
    /// path (git 2.27 and later). Ignored by default.
    fn request(&mut self, _meta: &RequestMeta) {}
}

/// The optional keys of a request: a checkout of a commit names its `treeish` (and `ref`, the
/// branch); every smudge of a known blob names the `blob`. A smudge for `git diff`, `git log
/// -p` or `git show` names the blob alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestMeta {
    /// `ref=`: the ref being checked out.
    pub reference: Option<String>,
    /// `treeish=`: the tree or commit being checked out.
    pub treeish: Option<String>,
    /// `blob=`: the git blob id of the content.
    pub blob: Option<String>,
}

/// A protocol violation or a broken pipe.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The packet stream itself is malformed.
    #[error("malformed packet from git: {0}")]
    Packet(#[from] pktline::Error),
    /// Well-formed packets in an order or with content the protocol does not allow.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// Writing to git failed.
    #[error("writing to git: {0}")]
    Write(#[source] io::Error),
}

fn violation(what: impl Into<String>) -> Error {
    Error::Protocol(what.into())
}

/// Runs the protocol on `input` (from git) and `output` (to git) until git closes `input`
/// after a complete request. `on_error` receives each per-file error message (for stderr).
pub fn serve(
    input: impl Read,
    output: impl Write,
    filter: &mut dyn Filter,
    on_error: &mut dyn FnMut(&str),
) -> Result<(), Error> {
    let mut r = PacketReader::new(io::BufReader::with_capacity(MAX_DATA + 4, input));
    let mut w = io::BufWriter::with_capacity(MAX_DATA + 4, output);
    let (clean, smudge) = handshake(&mut r, &mut w)?;
    loop {
        // The request header: key=value lines up to a flush; the end of the stream here is
        // git closing the pipe after its last request.
        let mut command = None;
        let mut pathname = None;
        let mut meta = RequestMeta::default();
        let mut first = true;
        loop {
            let packet = r.read()?;
            let data = match packet {
                None if first => return Ok(()),
                None => return Err(violation("the stream ended inside a request header")),
                Some(Packet::Flush) => break,
                Some(Packet::Data(d)) => d,
            };
            first = false;
            let line = pktline::text(data).ok_or_else(|| violation("a request header line is not UTF-8"))?;
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| violation(format!("request header line {line:?} is not key=value")))?;
            match key {
                "command" => command = Some(value.to_string()),
                "pathname" => pathname = Some(value.to_string()),
                "ref" => meta.reference = Some(value.to_string()),
                "treeish" => meta.treeish = Some(value.to_string()),
                "blob" => meta.blob = Some(value.to_string()),
                // can-delay: nothing ckpt needs.
                _ => {}
            }
        }
        let command = command.ok_or_else(|| violation("a request without command="))?;
        let path = pathname.ok_or_else(|| violation(format!("request {command:?} without pathname=")))?;
        let command = match command.as_str() {
            "clean" if clean => Command::Clean,
            "smudge" if smudge => Command::Smudge,
            other => return Err(violation(format!("command {other:?} was not negotiated"))),
        };
        let mut content = Content { r: &mut r, at: 0, end: false, error: None };
        let mut answer = Answer { w: &mut w, buf: Vec::new(), started: false, error: None };
        filter.request(&meta);
        let result = filter.filter(command, &path, &mut content, &mut answer);
        if let Some(e) = content.error.take() {
            return Err(e);
        }
        // The filter may stop reading early (an error, or a pointer recognised from its
        // start): the rest of the content is read and dropped so the next request starts at
        // a packet boundary.
        content.drain()?;
        if let Some(e) = answer.error.take() {
            return Err(Error::Write(e));
        }
        match result {
            Ok(()) => answer.finish().map_err(Error::Write)?,
            Err(message) => {
                on_error(&format!("{path}: {message}"));
                answer.fail().map_err(Error::Write)?;
            }
        }
    }
}

/// `git-filter-client`, versions, flush → `git-filter-server`, `version=2`, flush; then the
/// capabilities git offers → the ones ckpt has. Returns whether clean and smudge were agreed.
fn handshake<R: Read>(r: &mut PacketReader<R>, w: &mut impl Write) -> Result<(bool, bool), Error> {
    let lines = read_lines(r, "the handshake")?;
    if lines.first().map(String::as_str) != Some("git-filter-client") {
        return Err(violation(format!("expected git-filter-client, got {:?}", lines.first())));
    }
    if !lines[1..].iter().any(|l| l == "version=2") {
        return Err(violation(format!("git offers no protocol version 2 ({:?})", &lines[1..])));
    }
    server_hello(w).map_err(Error::Write)?;
    let caps = read_lines(r, "the capability list")?;
    let clean = caps.iter().any(|c| c == "capability=clean");
    let smudge = caps.iter().any(|c| c == "capability=smudge");
    capabilities(w, clean, smudge).map_err(Error::Write)?;
    Ok((clean, smudge))
}

fn server_hello(w: &mut impl Write) -> io::Result<()> {
    pktline::write_line(w, "git-filter-server")?;
    pktline::write_line(w, "version=2")?;
    pktline::write_flush(w)?;
    w.flush()
}

fn capabilities(w: &mut impl Write, clean: bool, smudge: bool) -> io::Result<()> {
    if clean {
        pktline::write_line(w, "capability=clean")?;
    }
    if smudge {
        pktline::write_line(w, "capability=smudge")?;
    }
    pktline::write_flush(w)?;
    w.flush()
}

/// Text lines up to a flush.
fn read_lines<R: Read>(r: &mut PacketReader<R>, what: &str) -> Result<Vec<String>, Error> {
    let mut lines = Vec::new();
    loop {
        match r.read()? {
            None => return Err(violation(format!("the stream ended during {what}"))),
            Some(Packet::Flush) => return Ok(lines),
            Some(Packet::Data(d)) => {
                let line = pktline::text(d).ok_or_else(|| violation(format!("a line of {what} is not UTF-8")))?;
                if lines.len() >= 64 {
                    return Err(violation(format!("more than 64 lines in {what}")));
                }
                lines.push(line.to_string());
            }
        }
    }
}

/// A request's content: its data packets up to the flush, as a byte stream.
struct Content<'r, R> {
    r: &'r mut PacketReader<R>,
    /// Bytes of the current packet already returned.
    at: usize,
    end: bool,
    /// A protocol error met while the filter was reading (the filter sees an I/O error).
    error: Option<Error>,
}

impl<R: Read> Content<'_, R> {
    fn drain(&mut self) -> Result<(), Error> {
        let mut sink = [0u8; 8192];
        while !self.end {
            self.read_inner(&mut sink)?;
        }
        Ok(())
    }

    fn read_inner(&mut self, buf: &mut [u8]) -> Result<usize, Error> {
        loop {
            if self.end {
                return Ok(0);
            }
            // The current packet is kept in the reader's buffer between calls.
            if self.at > 0 {
                let d = self.r.last_data();
                if self.at < d.len() {
                    let n = buf.len().min(d.len() - self.at);
                    buf[..n].copy_from_slice(&d[self.at..self.at + n]);
                    self.at += n;
                    return Ok(n);
                }
            }
            self.at = 0;
            match self.r.read()? {
                None => return Err(violation("the stream ended inside a file's content")),
                Some(Packet::Flush) => self.end = true,
                Some(Packet::Data([])) => {}
                Some(Packet::Data(d)) => {
                    let n = buf.len().min(d.len());
                    buf[..n].copy_from_slice(&d[..n]);
                    self.at = n;
                    return Ok(n);
                }
            }
        }
    }
}

impl<R: Read> Read for Content<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.read_inner(buf).map_err(|e| {
            let message = e.to_string();
            self.error = Some(e);
            io::Error::new(io::ErrorKind::InvalidData, message)
        })
    }
}

/// A request's answer: `status=success` and a flush before the first content packet, content
/// in packets of at most [`MAX_DATA`] bytes.
struct Answer<'w, W: Write> {
    w: &'w mut W,
    buf: Vec<u8>,
    started: bool,
    /// A write to git failed (the filter sees it as an I/O error; serve ends).
    error: Option<io::Error>,
}

impl<W: Write> Answer<'_, W> {
    fn start(&mut self) -> io::Result<()> {
        if !self.started {
            self.started = true;
            pktline::write_line(self.w, "status=success")?;
            pktline::write_flush(self.w)?;
        }
        Ok(())
    }

    fn send_buffered(&mut self) -> io::Result<()> {
        self.start()?;
        if !self.buf.is_empty() {
            pktline::write_packet(self.w, &self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    /// Content flush, then an empty list: the status stays `success`.
    fn finish(mut self) -> io::Result<()> {
        self.send_buffered()?;
        pktline::write_flush(self.w)?;
        pktline::write_flush(self.w)?;
        self.w.flush()
    }

    /// `status=error` for this file: right away if no content was sent, else after a content
    /// flush (git then drops what it received).
    fn fail(self) -> io::Result<()> {
        if self.started {
            pktline::write_flush(self.w)?;
        }
        pktline::write_line(self.w, "status=error")?;
        pktline::write_flush(self.w)?;
        self.w.flush()
    }
}

impl<W: Write> Write for Answer<'_, W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let result = (|| -> io::Result<usize> {
            let n = data.len().min(MAX_DATA - self.buf.len());
            self.buf.extend_from_slice(&data[..n]);
            if self.buf.len() == MAX_DATA {
                self.send_buffered()?;
            }
            Ok(n)
        })();
        if let Err(e) = &result {
            self.error = Some(io::Error::new(e.kind(), e.to_string()));
        }
        result
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pktline::{write_flush, write_line, write_packet};

    /// Upper-cases clean input, fails on paths starting with "bad", reverses smudge input.
    struct Upper;

    impl Filter for Upper {
        fn filter(
            &mut self,
            command: Command,
            path: &str,
            input: &mut dyn Read,
            output: &mut dyn Write,
        ) -> Result<(), FilterError> {
            if path.starts_with("bad") {
                // Reads only part of the content: the server must drain the rest.
                let mut one = [0u8; 1];
                let _ = input.read(&mut one);
                return Err("bad path".into());
            }
            let mut bytes = Vec::new();
            input.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
            match command {
                Command::Clean => bytes.make_ascii_uppercase(),
                Command::Smudge => bytes.reverse(),
            }
            Ok(output.write_all(&bytes)?)
        }
    }

    fn handshake_bytes(out: &mut Vec<u8>) {
        write_line(out, "git-filter-client").unwrap();
        write_line(out, "version=2").unwrap();
        write_flush(out).unwrap();
        write_line(out, "capability=clean").unwrap();
        write_line(out, "capability=smudge").unwrap();
        write_line(out, "capability=delay").unwrap();
        write_flush(out).unwrap();
    }

    fn request(out: &mut Vec<u8>, command: &str, path: &str, content: &[u8]) {
        write_line(out, &format!("command={command}")).unwrap();
        write_line(out, &format!("pathname={path}")).unwrap();
        write_line(out, "can-delay=1").unwrap();
        write_flush(out).unwrap();
        for c in content.chunks(MAX_DATA) {
            write_packet(out, c).unwrap();
        }
        write_flush(out).unwrap();
    }

    fn run(input: &[u8]) -> (Result<(), Error>, Vec<u8>, Vec<String>) {
        let mut out = Vec::new();
        let mut errors = Vec::new();
        let r = serve(input, &mut out, &mut Upper, &mut |m| errors.push(m.to_string()));
        (r, out, errors)
    }

    fn expected_prefix() -> Vec<u8> {
        let mut e = Vec::new();
        write_line(&mut e, "git-filter-server").unwrap();
        write_line(&mut e, "version=2").unwrap();
        write_flush(&mut e).unwrap();
        write_line(&mut e, "capability=clean").unwrap();
        write_line(&mut e, "capability=smudge").unwrap();
        write_flush(&mut e).unwrap();
        e
    }

    #[test]
    fn requests_are_answered_and_errors_are_per_file() {
        let big: Vec<u8> = (0..200_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let mut input = Vec::new();
        handshake_bytes(&mut input);
        request(&mut input, "clean", "a.bin", b"hello");
        request(&mut input, "clean", "bad.bin", &big);
        request(&mut input, "smudge", "c.bin", b"abc");
        request(&mut input, "clean", "big.bin", &big);
        request(&mut input, "clean", "empty.bin", b"");
        let (r, out, errors) = run(&input);
        r.unwrap();
        let mut e = expected_prefix();
        let success = |e: &mut Vec<u8>, content: &[u8]| {
            write_line(e, "status=success").unwrap();
            write_flush(e).unwrap();
            for c in content.chunks(MAX_DATA) {
                write_packet(e, c).unwrap();
            }
            write_flush(e).unwrap();
            write_flush(e).unwrap();
        };
        success(&mut e, b"HELLO");
        write_line(&mut e, "status=error").unwrap();
        write_flush(&mut e).unwrap();
        success(&mut e, b"cba");
        success(&mut e, &big.to_ascii_uppercase());
        success(&mut e, b"");
        assert_eq!(out, e);
        assert_eq!(errors, vec!["bad.bin: bad path".to_string()]);
    }

    #[test]
    fn protocol_violations_end_the_server_with_a_message() {
        let bad_cases: Vec<(Vec<u8>, &str)> = vec![
            (b"0000".to_vec(), "expected git-filter-client"),
            (b"garbage!".to_vec(), "not 4 hex digits"),
            (
                {
                    let mut v = Vec::new();
                    write_line(&mut v, "git-filter-client").unwrap();
                    write_line(&mut v, "version=3").unwrap();
                    write_flush(&mut v).unwrap();
                    v
                },
                "no protocol version 2",
            ),
            (
                {
                    let mut v = Vec::new();
                    handshake_bytes(&mut v);
                    write_line(&mut v, "command=clean").unwrap();
                    write_flush(&mut v).unwrap();
                    v
                },
                "without pathname",
            ),
            (
                {
                    let mut v = Vec::new();
                    handshake_bytes(&mut v);
                    request(&mut v, "list_available_blobs", "x", b"");
                    v
                },
                "not negotiated",
            ),
            (
                {
                    let mut v = Vec::new();
                    handshake_bytes(&mut v);
                    write_line(&mut v, "command=clean").unwrap();
                    write_line(&mut v, "pathname=a").unwrap();
                    write_flush(&mut v).unwrap();
                    write_packet(&mut v, b"partial").unwrap();
                    v
                },
                "ended inside a file's content",
            ),
            (
                {
                    let mut v = Vec::new();
                    handshake_bytes(&mut v);
                    write_line(&mut v, "command=clean").unwrap();
                    write_line(&mut v, "pathname=a").unwrap();
                    write_flush(&mut v).unwrap();
                    v.extend_from_slice(b"ffffxyz");
                    v
                },
                "over the limit",
            ),
        ];
        for (input, message) in bad_cases {
            let (r, _, _) = run(&input);
            let e = r.unwrap_err().to_string();
            assert!(e.contains(message), "{e:?} should mention {message:?}");
        }
    }

    #[test]
    fn a_closed_pipe_after_the_handshake_is_a_clean_end() {
        let mut input = Vec::new();
        handshake_bytes(&mut input);
        let (r, out, _) = run(&input);
        r.unwrap();
        assert_eq!(out, expected_prefix());
    }
}
