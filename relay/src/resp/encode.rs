//! Replies as RESP bytes, in the protocol the client chose (`HELLO`).

use bytes::{BufMut, BytesMut};
use tokio_util::codec::Encoder;

use crate::reply::Reply;

/// RESP2 (every connection's start) or RESP3 (after `HELLO 3`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    #[default]
    Resp2,
    Resp3,
}

impl Protocol {
    pub fn version(self) -> i64 {
        match self {
            Protocol::Resp2 => 2,
            Protocol::Resp3 => 3,
        }
    }
}

/// Writes `(protocol, reply)` pairs.
#[derive(Debug, Default)]
pub struct Writer;

impl Encoder<(Protocol, Reply)> for Writer {
    type Error = std::io::Error;

    fn encode(&mut self, (protocol, reply): (Protocol, Reply), out: &mut BytesMut) -> std::io::Result<()> {
        write(&reply, protocol, out);
        Ok(())
    }
}

/// `kind`, the number, CRLF (rl-core's decimal writer: no formatter).
fn line(out: &mut BytesMut, kind: u8, n: i64) {
    let mut digits = [0u8; 20];
    out.put_u8(kind);
    if n < 0 {
        out.put_u8(b'-');
    }
    out.put_slice(rl_core::codec::decimal(n.unsigned_abs(), &mut digits));
    out.put_slice(b"\r\n");
}

/// A simple string or error: no CR or LF may be in it (Redis replaces them).
fn text(out: &mut BytesMut, kind: u8, text: &str) {
    out.put_u8(kind);
    out.extend(text.bytes().map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
    out.put_slice(b"\r\n");
}

fn bulk(out: &mut BytesMut, bytes: &[u8]) {
    line(out, b'$', bytes.len() as i64);
    out.put_slice(bytes);
    out.put_slice(b"\r\n");
}

fn double(d: f64) -> String {
    if d.is_nan() {
        "nan".into()
    } else if d.is_infinite() {
        if d > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        d.to_string()
    }
}

pub fn write(reply: &Reply, protocol: Protocol, out: &mut BytesMut) {
    let resp3 = protocol == Protocol::Resp3;
    match reply {
        Reply::Simple(s) => text(out, b'+', s),
        Reply::Error(e) => text(out, b'-', e),
        Reply::Int(i) => line(out, b':', *i),
        Reply::Bulk(b) => bulk(out, b),
        Reply::Null if resp3 => out.put_slice(b"_\r\n"),
        Reply::Null => out.put_slice(b"$-1\r\n"),
        Reply::Array(items) => {
            line(out, b'*', items.len() as i64);
            for item in items {
                write(item, protocol, out);
            }
        }
        Reply::Map(pairs) => {
            if resp3 {
                line(out, b'%', pairs.len() as i64);
            } else {
                line(out, b'*', 2 * pairs.len() as i64);
            }
            for (k, v) in pairs {
                write(k, protocol, out);
                write(v, protocol, out);
            }
        }
        Reply::Double(d) if resp3 => text(out, b',', &double(*d)),
        Reply::Double(d) => bulk(out, double(*d).as_bytes()),
        Reply::Bool(b) if resp3 => out.put_slice(if *b { b"#t\r\n" } else { b"#f\r\n" }),
        Reply::Bool(b) => line(out, b':', i64::from(*b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(reply: Reply, protocol: Protocol) -> String {
        let mut out = BytesMut::new();
        write(&reply, protocol, &mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn writes_each_type_in_each_protocol() {
        use Protocol::*;
        let six = Reply::Array(vec![Reply::Int(1), Reply::Int(-42), Reply::Int(i64::MIN)]);
        assert_eq!(bytes(six.clone(), Resp2), "*3\r\n:1\r\n:-42\r\n:-9223372036854775808\r\n");
        assert_eq!(bytes(six.clone(), Resp2), bytes(six, Resp3));
        assert_eq!(bytes(Reply::Null, Resp2), "$-1\r\n");
        assert_eq!(bytes(Reply::Null, Resp3), "_\r\n");
        let map = Reply::Map(vec![(Reply::bulk("proto"), Reply::Int(3))]);
        assert_eq!(bytes(map.clone(), Resp2), "*2\r\n$5\r\nproto\r\n:3\r\n");
        assert_eq!(bytes(map, Resp3), "%1\r\n$5\r\nproto\r\n:3\r\n");
        assert_eq!(bytes(Reply::Double(1.5), Resp3), ",1.5\r\n");
        assert_eq!(bytes(Reply::Double(f64::INFINITY), Resp2), "$3\r\ninf\r\n");
        assert_eq!(bytes(Reply::Bool(true), Resp3), "#t\r\n");
        assert_eq!(bytes(Reply::Bool(false), Resp2), ":0\r\n");
        assert_eq!(bytes(Reply::error("ERR a\r\nb"), Resp2), "-ERR a  b\r\n");
        assert_eq!(bytes(Reply::OK, Resp3), "+OK\r\n");
        assert_eq!(bytes(Reply::Int(0), Resp2), ":0\r\n");
    }
}
