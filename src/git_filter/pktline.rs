//! git's pkt-line framing (gitprotocol-common(5)): each packet is 4 lowercase hex digits giving
//! its length including those 4, then the data; `0000` is a flush packet. At most
//! [`MAX_DATA`] bytes of data per packet.
//!
//! Input is untrusted: a length that is not hex, that names a special packet the filter
//! protocol does not use (`0001`–`0003`), or that exceeds the limit is an error, and a stream
//! that ends inside a packet is an error; nothing is allocated beyond one packet's buffer.

use std::io::{self, Read, Write};

/// The largest data part of a packet (65520 bytes in all, minus the 4-byte length).
pub const MAX_DATA: usize = 65516;

/// A malformed packet stream.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading or writing the pipe failed.
    #[error("{action} the pipe: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The underlying error.
        source: io::Error,
    },
    /// The length field is not 4 hex digits.
    #[error("packet length {0:?} is not 4 hex digits")]
    BadLength(String),
    /// A length of 1 to 3: special packets of protocol v2 that the filter protocol never sends.
    #[error("unexpected special packet {0:04x}")]
    Special(usize),
    /// A length above the limit.
    #[error("packet of {0} bytes is over the limit of {max}", max = MAX_DATA + 4)]
    TooLong(usize),
    /// The stream ended inside a packet.
    #[error("the stream ended inside a packet ({got} of {want} bytes)")]
    Truncated {
        /// Bytes read.
        got: usize,
        /// Bytes the packet needs.
        want: usize,
    },
}

/// One packet read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Packet<'a> {
    /// `0000`.
    Flush,
    /// A data packet (possibly empty: `0004`).
    Data(&'a [u8]),
}

/// Reads packets from a byte stream, reusing one buffer.
pub(crate) struct PacketReader<R> {
    inner: R,
    buf: Vec<u8>,
}

impl<R: Read> PacketReader<R> {
    /// Reads packets from `inner` (buffer it if it is unbuffered: every packet costs two reads).
    pub fn new(inner: R) -> Self {
        PacketReader { inner, buf: Vec::with_capacity(MAX_DATA) }
    }

    /// The next packet; `None` at the end of the stream between two packets.
    pub fn read(&mut self) -> Result<Option<Packet<'_>>, Error> {
        let mut len = [0u8; 4];
        let got = read_full(&mut self.inner, &mut len)?;
        if got == 0 {
            return Ok(None);
        }
        if got < 4 {
            return Err(Error::Truncated { got, want: 4 });
        }
        let text = std::str::from_utf8(&len).ok().filter(|t| t.bytes().all(|b| b.is_ascii_hexdigit()));
        let Some(n) = text.and_then(|t| usize::from_str_radix(t, 16).ok()) else {
            return Err(Error::BadLength(String::from_utf8_lossy(&len).into_owned()));
        };
        match n {
            0 => return Ok(Some(Packet::Flush)),
            1..=3 => return Err(Error::Special(n)),
            n if n > MAX_DATA + 4 => return Err(Error::TooLong(n)),
            _ => {}
        }
        self.buf.resize(n - 4, 0);
        let got = read_full(&mut self.inner, &mut self.buf)?;
        if got < n - 4 {
            return Err(Error::Truncated { got: got + 4, want: n });
        }
        Ok(Some(Packet::Data(&self.buf)))
    }
}

impl<R> PacketReader<R> {
    /// The data of the last packet read, if it was a data packet (unspecified otherwise).
    pub(crate) fn last_data(&self) -> &[u8] {
        &self.buf
    }
}

/// Reads until `buf` is full or the stream ends; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> Result<usize, Error> {
    let mut at = 0;
    while at < buf.len() {
        match r.read(&mut buf[at..]) {
            Ok(0) => break,
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => return Err(Error::Io { action: "reading", source }),
        }
    }
    Ok(at)
}

/// Writes one data packet of at most [`MAX_DATA`] bytes.
pub fn write_packet(w: &mut impl Write, data: &[u8]) -> io::Result<()> {
    debug_assert!(data.len() <= MAX_DATA);
    write!(w, "{:04x}", data.len() + 4)?;
    w.write_all(data)
}

/// Writes a flush packet.
pub fn write_flush(w: &mut impl Write) -> io::Result<()> {
    w.write_all(b"0000")
}

/// Writes `text` and a newline as one packet (the form of the protocol's text lines).
pub fn write_line(w: &mut impl Write, text: &str) -> io::Result<()> {
    writeln!(w, "{:04x}{text}", text.len() + 5)
}

/// A text packet's content: the data without its one trailing newline, if UTF-8.
pub fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data.strip_suffix(b"\n").unwrap_or(data)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn packets(bytes: &[u8]) -> Result<Vec<Option<Vec<u8>>>, Error> {
        let mut r = PacketReader::new(bytes);
        let mut out = Vec::new();
        while let Some(p) = r.read()? {
            out.push(match p {
                Packet::Flush => None,
                Packet::Data(d) => Some(d.to_vec()),
            });
        }
        Ok(out)
    }

    #[test]
    fn reads_data_flush_and_empty_packets() {
        let got = packets(b"000ahello\n00000004").unwrap();
        assert_eq!(got, vec![Some(b"hello\n".to_vec()), None, Some(Vec::new())]);
        // Upper-case hex digits are hex too.
        assert_eq!(packets(b"000Ahello\n").unwrap(), vec![Some(b"hello\n".to_vec())]);
    }

    #[test]
    fn malformed_streams_are_errors_not_panics() {
        assert!(matches!(packets(b"zzzz"), Err(Error::BadLength(_))));
        assert!(matches!(packets(b"+0a0hello"), Err(Error::BadLength(_))));
        assert!(matches!(packets(b"0001"), Err(Error::Special(1))));
        assert!(matches!(packets(b"0003"), Err(Error::Special(3))));
        assert!(matches!(packets(b"fff1"), Err(Error::TooLong(0xfff1))));
        assert!(matches!(packets(b"ffff"), Err(Error::TooLong(0xffff))));
        assert!(matches!(packets(b"00"), Err(Error::Truncated { got: 2, want: 4 })));
        assert!(matches!(packets(b"000ahel"), Err(Error::Truncated { got: 7, want: 10 })));
    }

    #[test]
    fn the_largest_packet_is_accepted_and_written() {
        let data = vec![7u8; MAX_DATA];
        let mut out = Vec::new();
        write_packet(&mut out, &data).unwrap();
        assert_eq!(&out[..4], b"fff0");
        assert_eq!(packets(&out).unwrap(), vec![Some(data)]);
    }

    #[test]
    fn lines_carry_a_newline() {
        let mut out = Vec::new();
        write_line(&mut out, "version=2").unwrap();
        write_flush(&mut out).unwrap();
        assert_eq!(out, b"000eversion=2\n0000");
        assert_eq!(text(b"version=2\n"), Some("version=2"));
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = packets(&bytes);
        }

        #[test]
        fn written_packets_read_back(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..100), 0..10)) {
            let mut out = Vec::new();
            for c in &chunks {
                write_packet(&mut out, c).unwrap();
            }
            write_flush(&mut out).unwrap();
            let mut expected: Vec<Option<Vec<u8>>> = chunks.into_iter().map(Some).collect();
            expected.push(None);
            prop_assert_eq!(packets(&out).unwrap(), expected);
        }
    }
}
