//! The RESP front's request reader: an array of bulk strings, or an inline
//! command line, and nothing else, as Redis reads a client.
//!
//! Every length is checked against the relay's limits when its header is
//! read, before any byte of it is buffered; there is no nesting (an array
//! inside a request is a protocol error), so no recursion and no depth to
//! bound. The state is kept between reads, so a request that arrives a byte
//! at a time costs what it would whole. An error is the text Redis sends,
//! and the connection is closed after it.

use bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::Decoder;

use crate::limits::Limits;

/// The longest `*<count>` or `$<length>` line: a 64-bit number and a sign.
const MAX_HEADER: usize = 32;

/// One command's arguments, and the bytes they hold.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub args: Vec<Bytes>,
    pub bytes: usize,
}

/// Why the reader stopped: the error line to send before closing, or the
/// socket's own error.
#[derive(Debug)]
pub enum ReadError {
    Protocol(String),
    Io(std::io::Error),
}

impl From<std::io::Error> for ReadError {
    fn from(e: std::io::Error) -> ReadError {
        ReadError::Io(e)
    }
}

fn protocol(what: impl std::fmt::Display) -> ReadError {
    ReadError::Protocol(format!("ERR Protocol error: {what}"))
}

/// Where the reader is within a request.
#[derive(Debug, Default)]
enum State {
    #[default]
    Idle,
    /// Inside `*<count>`: `left` arguments to go, the next one's length if
    /// its header was read.
    Array { left: usize, args: Vec<Bytes>, bytes: usize, bulk: Option<usize> },
}

#[derive(Debug)]
pub struct Reader {
    limits: Limits,
    state: State,
}

impl Reader {
    pub fn new(limits: Limits) -> Reader {
        Reader { limits, state: State::Idle }
    }
}

impl Decoder for Reader {
    type Item = Request;
    type Error = ReadError;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Request>, ReadError> {
        loop {
            match &mut self.state {
                State::Idle => {
                    let Some(&first) = buf.first() else { return Ok(None) };
                    if first != b'*' {
                        match inline(buf, self.limits)? {
                            Some(request) if request.args.is_empty() => continue,
                            other => return Ok(other),
                        }
                    }
                    let Some(count) = header(buf, "too big mbulk count string")? else { return Ok(None) };
                    let count = match count {
                        Some(n) if n <= 0 => continue, // `*0`, `*-1`: skipped, as Redis does
                        Some(n) if n as u64 <= self.limits.max_arguments as u64 => n as usize,
                        Some(n) => {
                            let max = self.limits.max_arguments;
                            return Err(protocol(format_args!(
                                "invalid multibulk length ({n} arguments; at most {max} here)"
                            )));
                        }
                        None => return Err(protocol("invalid multibulk length")),
                    };
                    self.state = State::Array { left: count, args: Vec::with_capacity(count), bytes: 0, bulk: None };
                }
                State::Array { left, args, bytes, bulk } => {
                    let len = match *bulk {
                        Some(len) => len,
                        None => {
                            let Some(&first) = buf.first() else { return Ok(None) };
                            if first != b'$' {
                                return Err(protocol(format_args!("expected '$', got '{}'", shown(first))));
                            }
                            let Some(len) = header(buf, "too big bulk count string")? else { return Ok(None) };
                            let room = self.limits.max_request_bytes - *bytes;
                            let len = match len {
                                Some(n) if n >= 0 && n as u64 <= room as u64 => n as usize,
                                Some(n) if n >= 0 => {
                                    let max = self.limits.max_request_bytes;
                                    return Err(protocol(format_args!(
                                        "invalid bulk length ({n} bytes; a command is at most {max} bytes here)"
                                    )));
                                }
                                _ => return Err(protocol("invalid bulk length")),
                            };
                            *bulk = Some(len);
                            len
                        }
                    };
                    if buf.len() < len + 2 {
                        // Room for the rest (bounded by the limit above), so
                        // the socket is read straight into it.
                        buf.reserve(len + 2 - buf.len());
                        return Ok(None);
                    }
                    if &buf[len..len + 2] != b"\r\n" {
                        return Err(protocol("expected CRLF after a bulk string"));
                    }
                    args.push(buf.split_to(len).freeze());
                    buf.advance(2);
                    *bytes += len;
                    *bulk = None;
                    *left -= 1;
                    if *left == 0 {
                        let State::Array { args, bytes, .. } = std::mem::take(&mut self.state) else { unreachable!() };
                        return Ok(Some(Request { args, bytes }));
                    }
                }
            }
        }
    }
}

/// A byte as Redis names it in "expected '$', got '%c'" (printable or not).
fn shown(byte: u8) -> String {
    if byte.is_ascii_graphic() || byte == b' ' {
        char::from(byte).to_string()
    } else {
        format!("\\x{byte:02x}")
    }
}

/// The number of a `*<n>\r\n` or `$<n>\r\n` line, consumed: Ok(None) while
/// incomplete, Some(None) if it is not a number.
fn header(buf: &mut BytesMut, too_big: &str) -> Result<Option<Option<i64>>, ReadError> {
    let window = &buf[..buf.len().min(MAX_HEADER)];
    let Some(cr) = window.iter().position(|&b| b == b'\r') else {
        return if buf.len() >= MAX_HEADER { Err(protocol(too_big)) } else { Ok(None) };
    };
    let Some(&lf) = buf.get(cr + 1) else { return Ok(None) };
    let number = if lf == b'\n' { strict_int(&buf[1..cr]) } else { None };
    buf.advance(cr + 2);
    Ok(Some(number))
}

/// A decimal integer as Redis's string2ll reads it: an optional minus, no
/// plus, no spaces, no leading zeros.
pub(super) fn strict_int(text: &[u8]) -> Option<i64> {
    let digits = text.strip_prefix(b"-").unwrap_or(text);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) || (digits[0] == b'0' && text.len() > 1) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// An inline command: one line, split into words as redis-cli's users
/// type them (quotes and escapes as Redis's sdssplitargs reads them).
fn inline(buf: &mut BytesMut, limits: Limits) -> Result<Option<Request>, ReadError> {
    // A line of the ceiling, its CR and its LF.
    let window = &buf[..buf.len().min(limits.max_request_bytes + 2)];
    let Some(newline) = window.iter().position(|&b| b == b'\n') else {
        return if buf.len() >= limits.max_request_bytes + 2 {
            Err(protocol(format_args!(
                "too big inline request (a command is at most {} bytes here)",
                limits.max_request_bytes
            )))
        } else {
            Ok(None)
        };
    };
    let line = buf.split_to(newline + 1);
    let line = line.strip_suffix(b"\n").unwrap_or(&line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let args = split_args(line).ok_or_else(|| protocol("unbalanced quotes in request"))?;
    if args.len() > limits.max_arguments {
        return Err(protocol(format_args!(
            "invalid multibulk length ({} arguments; at most {} here)",
            args.len(),
            limits.max_arguments
        )));
    }
    let bytes = args.iter().map(Bytes::len).sum();
    Ok(Some(Request { args, bytes }))
}

fn hex(b: u8) -> Option<u8> {
    char::from(b).to_digit(16).map(|d| d as u8)
}

/// Redis's sdssplitargs: words apart by spaces; "double quotes" with
/// \n \r \t \b \a \xHH escapes, 'single quotes' with \' only; a closing
/// quote must end the word. None for unbalanced quotes. A NUL ends the
/// line, as it ends the C string Redis splits.
fn split_args(line: &[u8]) -> Option<Vec<Bytes>> {
    let line = &line[..line.iter().position(|&b| b == 0).unwrap_or(line.len())];
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while line.get(i).is_some_and(|b| b.is_ascii_whitespace() || *b == 0x0b) {
            i += 1;
        }
        if i >= line.len() {
            return Some(args);
        }
        let mut word = Vec::new();
        let (mut in_double, mut in_single) = (false, false);
        loop {
            let c = line.get(i).copied();
            if in_double {
                match (c?, line.get(i + 1).copied()) {
                    (b'\\', Some(b'x')) if line.get(i + 2).and_then(|&b| hex(b)).is_some() => {
                        match line.get(i + 3).and_then(|&b| hex(b)) {
                            Some(low) => {
                                word.push(hex(line[i + 2])? * 16 + low);
                                i += 3;
                            }
                            None => word.push(b'\\'),
                        }
                    }
                    (b'\\', Some(next)) => {
                        word.push(match next {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 0x08,
                            b'a' => 0x07,
                            other => other,
                        });
                        i += 1;
                    }
                    (b'"', after) => {
                        if after.is_some_and(|b| !b.is_ascii_whitespace()) {
                            return None;
                        }
                        i += 1;
                        break;
                    }
                    (other, _) => word.push(other),
                }
            } else if in_single {
                match (c?, line.get(i + 1).copied()) {
                    (b'\\', Some(b'\'')) => {
                        word.push(b'\'');
                        i += 1;
                    }
                    (b'\'', after) => {
                        if after.is_some_and(|b| !b.is_ascii_whitespace()) {
                            return None;
                        }
                        i += 1;
                        break;
                    }
                    (other, _) => word.push(other),
                }
            } else {
                match c {
                    None | Some(b' ' | b'\n' | b'\r' | b'\t') => break,
                    Some(b'"') => in_double = true,
                    Some(b'\'') => in_single = true,
                    Some(other) => word.push(other),
                }
            }
            i += 1;
        }
        args.push(Bytes::from(word));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: Limits = Limits {
        max_request_bytes: 4096,
        max_arguments: 16,
        max_pending_bytes: 1 << 20,
        max_clients: 10,
        auth_timeout: std::time::Duration::from_secs(10),
    };

    /// Everything `bytes` holds, fed in pieces of `chunk` bytes: the
    /// requests, then the error if one came.
    fn read_all(bytes: &[u8], chunk: usize) -> (Vec<Vec<Bytes>>, Option<String>) {
        let mut reader = Reader::new(LIMITS);
        let mut buf = BytesMut::new();
        let mut requests = Vec::new();
        for piece in bytes.chunks(chunk.max(1)) {
            buf.extend_from_slice(piece);
            loop {
                match reader.decode(&mut buf) {
                    Ok(Some(r)) => requests.push(r.args),
                    Ok(None) => break,
                    Err(ReadError::Protocol(e)) => return (requests, Some(e)),
                    Err(ReadError::Io(e)) => panic!("{e}"),
                }
                // Never more buffered than a request's ceiling and a read.
                assert!(buf.capacity() <= 2 * (LIMITS.max_request_bytes + MAX_HEADER) + bytes.len().min(8192));
            }
        }
        (requests, None)
    }

    fn words(line: &str) -> Vec<Bytes> {
        line.split(' ').map(|w| Bytes::copy_from_slice(w.as_bytes())).collect()
    }

    #[test]
    fn reads_arrays_of_bulk_strings_and_inline_lines() {
        let wire = b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\nPING there\r\n*0\r\n\r\n  \r\n*1\r\n$0\r\n\r\n";
        for chunk in [1, 2, 3, 7, 64] {
            let (requests, error) = read_all(wire, chunk);
            assert_eq!(error, None);
            assert_eq!(requests, [words("PING hi"), words("PING there"), vec![Bytes::new()]], "chunk {chunk}");
        }
    }

    #[test]
    fn refuses_what_redis_refuses_with_its_words() {
        for (wire, error) in [
            (&b"*1\r\n*1\r\n"[..], "ERR Protocol error: expected '$', got '*'"),
            (b"*1\r\n+PING\r\n", "ERR Protocol error: expected '$', got '+'"),
            (b"*1\r\n\x01", "ERR Protocol error: expected '$', got '\\x01'"),
            (b"*1\r\n$4\r\nPINGxx", "ERR Protocol error: expected CRLF after a bulk string"),
            (b"*x\r\n", "ERR Protocol error: invalid multibulk length"),
            (b"*01\r\n", "ERR Protocol error: invalid multibulk length"),
            (b"*+1\r\n", "ERR Protocol error: invalid multibulk length"),
            (b"*1\rx", "ERR Protocol error: invalid multibulk length"),
            (b"*17\r\n", "ERR Protocol error: invalid multibulk length (17 arguments; at most 16 here)"),
            (b"*1\r\n$-1\r\n", "ERR Protocol error: invalid bulk length"),
            (b"*1\r\n$ 1\r\n", "ERR Protocol error: invalid bulk length"),
            (
                b"*1\r\n$4097\r\n",
                "ERR Protocol error: invalid bulk length (4097 bytes; a command is at most 4096 bytes here)",
            ),
            (b"*1\r\n$99999999999999999999\r\n", "ERR Protocol error: invalid bulk length"),
            (&[b'*'; 40], "ERR Protocol error: too big mbulk count string"),
            (b"*1\r\n$1111111111111111111111111111111111", "ERR Protocol error: too big bulk count string"),
            (b"PING \"a\r\n", "ERR Protocol error: unbalanced quotes in request"),
            (b"PING \"a\"b\r\n", "ERR Protocol error: unbalanced quotes in request"),
            (b"PING 'a\r\n", "ERR Protocol error: unbalanced quotes in request"),
        ] {
            let (_, e) = read_all(wire, 1);
            assert_eq!(e.as_deref(), Some(error), "{:?}", String::from_utf8_lossy(wire));
        }
        // Arguments adding up past the ceiling, each below it.
        let mut wire = b"*3\r\n".to_vec();
        for _ in 0..3 {
            wire.extend_from_slice(format!("$1500\r\n{}\r\n", "x".repeat(1500)).as_bytes());
        }
        assert!(read_all(&wire, 100).1.unwrap().starts_with("ERR Protocol error: invalid bulk length (1500 bytes"));
        let (_, e) = read_all(&[b'a'; 5000], 100);
        assert_eq!(e.unwrap(), "ERR Protocol error: too big inline request (a command is at most 4096 bytes here)");
    }

    #[test]
    fn splits_inline_words_as_redis_does() {
        let split = |line: &str| split_args(line.as_bytes()).map(|a| a.iter().map(|w| w.to_vec()).collect::<Vec<_>>());
        assert_eq!(split("  a  b\tc "), Some(vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]));
        assert_eq!(split(r#""a b" 'c d' "\x41\n\q" 'it\'s'"#).unwrap()[2], b"A\nq".to_vec());
        assert_eq!(split(r#"'it\'s'"#).unwrap(), vec![b"it's".to_vec()]);
        assert_eq!(split(r#""\x4""#).unwrap(), vec![b"\\x4".to_vec()]);
        assert_eq!(split(r#""""#).unwrap(), vec![Vec::<u8>::new()]);
        assert_eq!(split(""), Some(vec![]));
        assert_eq!(split("a\0b c"), Some(vec![b"a".to_vec()]), "a NUL ends the line");
        assert_eq!(split("\"a\0b\""), None);
    }

    fn encode(args: &[Vec<u8>]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Arbitrary bytes in arbitrary pieces: no panic, nothing buffered
        /// past the ceiling (checked in read_all), and the same outcome
        /// whatever the pieces.
        #[test]
        fn arbitrary_streams_never_panic_nor_grow(bytes in proptest::collection::vec(any::<u8>(), 0..6000), chunk in 1usize..512) {
            let whole = read_all(&bytes, bytes.len().max(1));
            let pieces = read_all(&bytes, chunk);
            prop_assert_eq!(whole, pieces);
        }

        /// Streams made of RESP's own pieces, where the interesting paths are.
        #[test]
        fn resp_shaped_streams_never_panic(parts in proptest::collection::vec(prop_oneof![
            Just(b"*1\r\n".to_vec()), Just(b"*2\r\n".to_vec()), Just(b"*-1\r\n".to_vec()), Just(b"*0\r\n".to_vec()),
            Just(b"$3\r\nabc\r\n".to_vec()), Just(b"$0\r\n\r\n".to_vec()), Just(b"$4096\r\n".to_vec()),
            Just(b"$-1\r\n".to_vec()), Just(b"\r\n".to_vec()), Just(b"PING \"x\"\r\n".to_vec()),
            Just(b"'".to_vec()), Just(b"\\x4".to_vec()), Just(b":1\r\n".to_vec()), Just(vec![b'x'; 700]),
        ], 0..40), chunk in 1usize..64) {
            let bytes = parts.concat();
            prop_assert_eq!(read_all(&bytes, bytes.len().max(1)), read_all(&bytes, chunk));
        }

        /// Well-formed commands come back as they were sent.
        #[test]
        fn well_formed_commands_round_trip(commands in proptest::collection::vec(
            proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..8), 1..10), chunk in 1usize..128) {
            let wire: Vec<u8> = commands.iter().flat_map(|c| encode(c)).collect();
            let (requests, error) = read_all(&wire, chunk);
            prop_assert_eq!(error, None);
            let expected: Vec<Vec<Bytes>> =
                commands.iter().map(|c| c.iter().map(|a| Bytes::copy_from_slice(a)).collect()).collect();
            prop_assert_eq!(requests, expected);
        }
    }
}
