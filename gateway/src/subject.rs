//! Subjects: who a limit is kept for. A subject goes inside a key's hash
//! tag, so it is checked before any key is built; a client address becomes
//! the subject of its network, an API key one that is safe to key on.
//! Live rules (feature live) group addresses with [`ip_subject`] too: one implementation.
//! The limiter's local state (leases, deny cache, fallback) is kept per
//! [`SubjectKey`]: a policy group and a subject.

use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use quick_cache::Equivalent;
use sha2::{Digest, Sha256};

use rl_client::{Error, Result};

/// The subject of a client address: `ip:` and its network of `ipv4_prefix`
/// (IPv4, also when seen as `::ffff:a.b.c.d`) or `ipv6_prefix` bits. An
/// IPv6 host owns a /64 and can rotate addresses inside it, so 64 is the
/// usual IPv6 prefix: every address of one /64 is one client.
///
/// ```
/// let ip = "2001:db8:1:2:aaaa::7".parse().unwrap();
/// assert_eq!(rl_gateway::ip_subject(ip, 32, 64)?, "ip:2001:db8:1:2::/64");
/// let v4 = "::ffff:192.0.2.9".parse().unwrap();
/// assert_eq!(rl_gateway::ip_subject(v4, 24, 64)?, "ip:192.0.2.0/24");
/// # Ok::<(), rl_gateway::Error>(())
/// ```
pub fn ip_subject(ip: IpAddr, ipv4_prefix: u8, ipv6_prefix: u8) -> Result<String> {
    let ip = ip.to_canonical();
    let len = if ip.is_ipv4() { ipv4_prefix } else { ipv6_prefix };
    // The network: the address with its host bits cleared.
    let network = match ip {
        IpAddr::V4(v4) if len <= 32 => {
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) & u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)))
        }
        IpAddr::V6(v6) if len <= 128 => {
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)))
        }
        _ => return Err(Error::invalid(format!("prefix /{len} for {ip}: invalid IP prefix length"))),
    };
    Ok(format!("ip:{network}/{len}"))
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

/// A subject goes inside the hash tag: braces would move the tag and split
/// a subject's buckets over several slots.
pub(crate) fn validate_subject(subject: &str) -> Result<()> {
    subject_fault(subject).map_or(Ok(()), |why| Err(Error::invalid(why)))
}

/// Why `subject` cannot be one, if it cannot: the text of
/// [`Policy::keys`](crate::Policy::keys)' error, for rule files too.
pub fn subject_fault(subject: &str) -> Option<String> {
    (subject.is_empty() || subject.len() > 512 || subject.contains(['{', '}']))
        .then(|| format!("subject must be 1 to 512 bytes without '{{' or '}}', got {:?}", truncate(subject)))
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// What local state is kept per: (policy group id, shadow group?, subject).
pub(crate) type SubjectKey = (u64, bool, Box<str>);

/// A [`SubjectKey`] borrowed from the request: the local maps (leases, deny
/// cache, fallback) are looked up with it without allocating. It hashes
/// and compares as the owned key; an owned one is made only to insert.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SubjectRef<'a>(pub(crate) u64, pub(crate) bool, pub(crate) &'a str);

impl Hash for SubjectRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As the tuple hashes: field by field, the Box<str> as its str.
        (self.0, self.1, self.2).hash(state);
    }
}

impl Equivalent<SubjectKey> for SubjectRef<'_> {
    fn equivalent(&self, key: &SubjectKey) -> bool {
        self.0 == key.0 && self.1 == key.1 && self.2 == &*key.2
    }
}

/// A key of local state, owned or borrowed.
pub(crate) trait Subject: Hash + Equivalent<SubjectKey> {
    /// The policy group id.
    fn group(&self) -> u64;
    /// The key to insert.
    fn owned(&self) -> SubjectKey;
}

impl Subject for SubjectKey {
    fn group(&self) -> u64 {
        self.0
    }

    fn owned(&self) -> SubjectKey {
        self.clone()
    }
}

impl Subject for SubjectRef<'_> {
    fn group(&self) -> u64 {
        self.0
    }

    fn owned(&self) -> SubjectKey {
        (self.0, self.1, self.2.into())
    }
}

/// Drops every entry of `map` kept for `subject`, in any group, enforced
/// or shadow: how many there were (counted under each shard's lock, so
/// exactly the ones removed).
pub(crate) fn forget_subject<V, W>(map: &quick_cache::sync::Cache<SubjectKey, V, W>, subject: &str) -> usize
where
    V: Clone,
    W: quick_cache::Weighter<SubjectKey, V> + Clone,
{
    let dropped = std::cell::Cell::new(0);
    map.retain(|key, _| {
        let kept = &*key.2 != subject;
        dropped.set(dropped.get() + usize::from(!kept));
        kept
    });
    dropped.get()
}

#[cfg(test)]
mod tests {
    use super::*;
    use quick_cache::sync::Cache;

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
    fn every_prefix_length_keeps_the_network_bits_only() {
        assert_eq!(ip_subject(ip("192.0.2.77"), 0, 64).unwrap(), "ip:0.0.0.0/0");
        assert_eq!(ip_subject(ip("192.0.2.77"), 31, 64).unwrap(), "ip:192.0.2.76/31");
        assert_eq!(ip_subject(ip("2001:db8::7"), 32, 128).unwrap(), "ip:2001:db8::7/128");
        assert_eq!(ip_subject(ip("2001:db8::7"), 32, 0).unwrap(), "ip:::/0");
        assert_eq!(ip_subject(ip("2001:db8:ffff::"), 32, 33).unwrap(), "ip:2001:db8:8000::/33");
        assert!(ip_subject(ip("2001:db8::7"), 32, 129).is_err());
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
    fn a_borrowed_subject_finds_its_owned_key() {
        let cache: Cache<SubjectKey, u32> = Cache::new(10);
        cache.insert(SubjectRef(7, true, "customer-1").owned(), 1);
        cache.insert((7, false, "customer-1".into()), 2);
        cache.insert((8, true, "customer-1".into()), 3);
        assert_eq!(cache.get(&SubjectRef(7, true, "customer-1")), Some(1));
        assert_eq!(cache.get(&SubjectRef(7, false, "customer-1")), Some(2));
        assert_eq!(cache.get(&SubjectRef(8, true, "customer-1")), Some(3));
        assert_eq!(cache.get(&SubjectRef(7, true, "customer-2")), None);
    }
}
