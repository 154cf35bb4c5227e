//! The client's IP address of a request, behind trusted proxies.

use std::net::IpAddr;

use http::HeaderMap;
use ipnet::IpNet;

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
/// use rl_gateway::http::{ClientIp, Trust};
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
