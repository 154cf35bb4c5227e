//! Who a request is, as a subject: the client's IP address (behind
//! trusted proxies, grouped by network) and API keys made safe to key on.
//! rl-rules groups addresses with [`ip_subject`] too: one implementation.

use std::net::IpAddr;

use http::HeaderMap;
use ipnet::IpNet;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The subject of a client address: `ip:` and its network of `ipv4_prefix`
/// (IPv4, also when seen as `::ffff:a.b.c.d`) or `ipv6_prefix` bits. An
/// IPv6 host owns a /64 and can rotate addresses inside it, so 64 is the
/// usual IPv6 prefix: every address of one /64 is one client.
///
/// ```
/// let ip = "2001:db8:1:2:aaaa::7".parse().unwrap();
/// assert_eq!(rl_client::ip_subject(ip, 32, 64)?, "ip:2001:db8:1:2::/64");
/// let v4 = "::ffff:192.0.2.9".parse().unwrap();
/// assert_eq!(rl_client::ip_subject(v4, 24, 64)?, "ip:192.0.2.0/24");
/// # Ok::<(), rl_client::Error>(())
/// ```
pub fn ip_subject(ip: IpAddr, ipv4_prefix: u8, ipv6_prefix: u8) -> Result<String> {
    let ip = ip.to_canonical();
    let len = if ip.is_ipv4() { ipv4_prefix } else { ipv6_prefix };
    let net = IpNet::new(ip, len).map_err(|e| Error::invalid(format!("prefix /{len} for {ip}: {e}")))?;
    Ok(format!("ip:{}", net.trunc()))
}

/// Longest API key used as its own subject; longer ones are hashed.
pub const MAX_PLAIN_KEY: usize = 128;

/// The subject for an API key as sent: the key itself when it is 1 to
/// [`MAX_PLAIN_KEY`] visible ASCII characters without braces, otherwise
/// `sha256:` and the hex SHA-256 of its bytes, so a non-ASCII, huge or
/// brace-holding key is still limited (never a bypass, never refused for
/// its length) and two keys cannot be made to collide. `None` for an empty
/// key.
pub fn key_subject(key: &[u8]) -> Option<String> {
    if key.is_empty() {
        return None;
    }
    let plain = key.len() <= MAX_PLAIN_KEY && key.iter().all(|&b| b.is_ascii_graphic() && b != b'{' && b != b'}');
    if plain {
        return Some(String::from_utf8_lossy(key).into_owned());
    }
    let digest = Sha256::digest(key);
    let mut subject = String::with_capacity(7 + 64);
    subject.push_str("sha256:");
    for b in digest {
        subject.push_str(&format!("{b:02x}"));
    }
    Some(subject)
}

/// Which proxies in front of the gateway are trusted to say who their
/// client was.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Trust {
    /// None: the client is the peer of the connection (the default).
    /// Forwarding headers are ignored: anyone can write them.
    #[default]
    Nobody,
    /// The peer and the `n - 1` proxies before it are ours: the client is
    /// the `n`th address counted from the peer, right to left through the
    /// forwarding header. Simple, but a client that reaches the gateway
    /// without the proxies can pick its address: prefer networks.
    Hops(usize),
    /// Proxies whose address is in one of these networks are ours: the
    /// client is the first address, from the right, outside them.
    Networks(Vec<IpNet>),
}

/// Which header trusted proxies write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ForwardHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`.
    Forwarded,
}

/// Finds the client's address from the connection's peer and the
/// forwarding header, trusting only the configured proxies: never blindly
/// the left-most value, which the client writes.
///
/// ```
/// use rl_client::{ClientIp, Trust};
/// use http::HeaderMap;
///
/// let ip = ClientIp::new(Trust::Networks(vec!["10.0.0.0/8".parse().unwrap()]));
/// let mut headers = HeaderMap::new();
/// headers.insert("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.1.1.1".parse().unwrap());
/// let peer = "10.0.0.2".parse().unwrap();
/// // 6.6.6.6 is what the client wrote; 203.0.113.7 is what our proxy saw.
/// assert_eq!(ip.client_ip(&headers, peer), "203.0.113.7".parse::<std::net::IpAddr>().unwrap());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientIp {
    trust: Trust,
    header: ForwardHeader,
}

impl ClientIp {
    /// Trusting `trust`, reading `X-Forwarded-For`.
    pub fn new(trust: Trust) -> ClientIp {
        ClientIp { trust, header: ForwardHeader::XForwardedFor }
    }

    /// The peer of the connection, nothing else.
    pub fn peer() -> ClientIp {
        ClientIp::default()
    }

    /// Reads `header` instead of `X-Forwarded-For`.
    pub fn header(self, header: ForwardHeader) -> ClientIp {
        ClientIp { header, ..self }
    }

    /// The client's address for a request from `peer` with `headers`.
    pub fn client_ip(&self, headers: &HeaderMap, peer: IpAddr) -> IpAddr {
        let peer = peer.to_canonical();
        if self.trust == Trust::Nobody {
            return peer;
        }
        // The chain, nearest first: what each proxy says it saw. An entry
        // that does not parse ends it: no trusted proxy wrote it.
        let mut chain = self.forwarded(headers).into_iter().rev();
        let mut client = peer;
        match &self.trust {
            Trust::Nobody => {}
            Trust::Hops(n) => {
                for _ in 1..=*n {
                    match chain.next().flatten() {
                        Some(ip) => client = ip,
                        None => break,
                    }
                }
            }
            Trust::Networks(nets) => {
                while nets.iter().any(|n| n.contains(&client)) {
                    match chain.next().flatten() {
                        Some(ip) => client = ip,
                        None => break,
                    }
                }
            }
        }
        client
    }

    /// Every address of the forwarding header (all its lines, in order),
    /// `None` where one does not parse.
    fn forwarded(&self, headers: &HeaderMap) -> Vec<Option<IpAddr>> {
        let name = match self.header {
            ForwardHeader::XForwardedFor => "x-forwarded-for",
            ForwardHeader::Forwarded => "forwarded",
        };
        let mut out = Vec::new();
        for line in headers.get_all(name) {
            let Ok(line) = line.to_str() else {
                out.push(None);
                continue;
            };
            for element in line.split(',') {
                let value = match self.header {
                    ForwardHeader::XForwardedFor => Some(element.trim()),
                    // for=... among the pairs of one element.
                    ForwardHeader::Forwarded => element.split(';').find_map(|pair| {
                        let (k, v) = pair.trim().split_once('=')?;
                        k.trim().eq_ignore_ascii_case("for").then_some(v.trim())
                    }),
                };
                out.push(value.and_then(parse_node));
            }
        }
        out
    }
}

/// An address as proxies write it: bare, quoted, `[v6]`, with a port.
fn parse_node(node: &str) -> Option<IpAddr> {
    let node = node.trim_matches('"');
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(sock) = node.parse::<std::net::SocketAddr>() {
        return Some(sock.ip().to_canonical());
    }
    node.strip_prefix('[').and_then(|n| n.strip_suffix(']')).and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(name: &str, values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(http::HeaderName::from_bytes(name.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn networks_group_clients() {
        assert_eq!(ip_subject(ip("2001:db8:1:2:ffff::1"), 32, 64).unwrap(), "ip:2001:db8:1:2::/64");
        assert_eq!(ip_subject(ip("2001:db8:1:3::1"), 32, 64).unwrap(), "ip:2001:db8:1:3::/64");
        assert_eq!(ip_subject(ip("192.0.2.77"), 32, 64).unwrap(), "ip:192.0.2.77/32");
        assert_eq!(ip_subject(ip("::ffff:192.0.2.77"), 24, 64).unwrap(), "ip:192.0.2.0/24");
        let e = ip_subject(ip("192.0.2.1"), 33, 64).unwrap_err().to_string();
        assert!(e.contains("prefix /33 for 192.0.2.1"), "{e}");
    }

    #[test]
    fn odd_keys_are_hashed_not_refused() {
        assert_eq!(key_subject(b"key_8f3").as_deref(), Some("key_8f3"));
        assert_eq!(key_subject(b""), None);
        let long = [b'a'; MAX_PLAIN_KEY + 1];
        for odd in [&long[..], "clé".as_bytes(), b"a{b}", b"a b", b"\xff\xfe"] {
            let s = key_subject(odd).unwrap();
            assert!(s.starts_with("sha256:") && s.len() == 71, "{s}");
            assert_eq!(key_subject(odd), Some(s), "stable");
        }
        assert_ne!(key_subject(b"a{b}"), key_subject(b"a{c}"));
        assert_eq!(key_subject(&long[..MAX_PLAIN_KEY]).unwrap().len(), MAX_PLAIN_KEY);
    }

    #[test]
    fn forwarding_headers_count_only_when_trusted() {
        let h = headers("x-forwarded-for", &["6.6.6.6, 203.0.113.7", "10.1.1.1"]);
        let peer = ip("10.0.0.2");
        assert_eq!(ClientIp::peer().client_ip(&h, peer), peer, "a spoofed header from an untrusted peer");
        let nets = ClientIp::new(Trust::Networks(vec!["10.0.0.0/8".parse().unwrap()]));
        assert_eq!(nets.client_ip(&h, peer), ip("203.0.113.7"));
        assert_eq!(nets.client_ip(&h, ip("198.51.100.1")), ip("198.51.100.1"), "peer outside the networks");
        assert_eq!(ClientIp::new(Trust::Hops(1)).client_ip(&h, peer), ip("10.1.1.1"));
        assert_eq!(ClientIp::new(Trust::Hops(2)).client_ip(&h, peer), ip("203.0.113.7"));
        // A chain shorter than the hops: the furthest address known.
        assert_eq!(ClientIp::new(Trust::Hops(9)).client_ip(&h, peer), ip("6.6.6.6"));
        // Garbage stops the walk at the last good address.
        let bad = headers("x-forwarded-for", &["1.2.3.4, junk, 10.1.1.1"]);
        assert_eq!(nets.client_ip(&bad, peer), ip("10.1.1.1"));
    }

    #[test]
    fn rfc_7239_forwarded_is_read() {
        let h = headers("forwarded", &["for=6.6.6.6, for=\"[2001:db8:cafe::17]:4711\";proto=https, for=10.0.0.9"]);
        let nets = ClientIp::new(Trust::Networks(vec!["10.0.0.0/8".parse().unwrap()])).header(ForwardHeader::Forwarded);
        assert_eq!(nets.client_ip(&h, ip("10.0.0.1")), ip("2001:db8:cafe::17"));
        let v4 = headers("forwarded", &["for=192.0.2.60:8080"]);
        assert_eq!(nets.client_ip(&v4, ip("10.0.0.1")), ip("192.0.2.60"));
    }
}
