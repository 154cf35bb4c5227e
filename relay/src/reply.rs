//! What the relay answers, whatever the front: the module's replies (six
//! integers), Redis's as forwarded, and the relay's own. The RESP front
//! writes it in the client's protocol (`resp::encode`).

use std::borrow::Cow;

use bytes::Bytes;
use redis::Value;

#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Simple(Cow<'static, str>),
    /// The whole error line: its code and text ("ERR ...", "NOAUTH ...").
    Error(Cow<'static, str>),
    Int(i64),
    Bulk(Bytes),
    Null,
    Array(Vec<Reply>),
    Map(Vec<(Reply, Reply)>),
    Double(f64),
    Bool(bool),
}

impl Reply {
    pub const OK: Reply = Reply::Simple(Cow::Borrowed("OK"));

    pub fn error(text: impl Into<Cow<'static, str>>) -> Reply {
        Reply::Error(text.into())
    }

    pub fn bulk(text: impl Into<Bytes>) -> Reply {
        Reply::Bulk(text.into())
    }

    /// The module's six-integer reply; RL.TAKE's first field is allowed (0/1).
    pub fn six(reply: rl_core::Reply, lease: bool) -> Reply {
        let first = if lease { reply.granted as i64 } else { i64::from(reply.granted > 0) };
        let fields = [
            first,
            reply.remaining as i64,
            reply.retry_after_ms,
            reply.reset_after_ms as i64,
            reply.limit as i64,
            reply.binding as i64,
        ];
        Reply::Array(fields.into_iter().map(Reply::Int).collect())
    }

    /// The module's six integers, if this is such a reply (the server's
    /// reading may follow them: RL.WINDOW's TIME).
    pub fn module_reply(&self) -> Option<rl_core::Reply> {
        let Reply::Array(items) = self else { return None };
        let [granted, remaining, retry_after_ms, reset_after_ms, limit, binding, ..] = &items[..] else { return None };
        if items.len() > 7 {
            return None;
        }
        let int = |r: &Reply| if let Reply::Int(i) = r { Some(*i) } else { None };
        Some(rl_core::Reply {
            granted: u64::try_from(int(granted)?).ok()?,
            remaining: u64::try_from(int(remaining)?).ok()?,
            retry_after_ms: int(retry_after_ms)?,
            reset_after_ms: u64::try_from(int(reset_after_ms)?).ok()?,
            limit: u64::try_from(int(limit)?).ok()?,
            binding: usize::try_from(int(binding)?).ok()?,
        })
    }

    /// The server's reading a call decided at: the seventh integer of
    /// `RL.WINDOW ... TIME`.
    pub fn module_time(&self) -> Option<u64> {
        match self {
            Reply::Array(items) if items.len() == 7 => match items[6] {
                Reply::Int(t) => u64::try_from(t).ok(),
                _ => None,
            },
            _ => None,
        }
    }
}

impl From<Value> for Reply {
    /// Redis's value as it came (RESP2 or RESP3 from the relay's connection).
    fn from(value: Value) -> Reply {
        match value {
            Value::Nil => Reply::Null,
            Value::Int(i) => Reply::Int(i),
            Value::BulkString(b) => Reply::Bulk(b.into()),
            Value::SimpleString(s) => Reply::Simple(s.into()),
            Value::Okay => Reply::OK,
            Value::Array(items) | Value::Set(items) => Reply::Array(items.into_iter().map(Reply::from).collect()),
            Value::Map(pairs) => Reply::Map(pairs.into_iter().map(|(k, v)| (k.into(), v.into())).collect()),
            Value::Double(d) => Reply::Double(d),
            Value::Boolean(b) => Reply::Bool(b),
            Value::VerbatimString { text, .. } => Reply::Bulk(text.into()),
            Value::Attribute { data, .. } => Reply::from(*data),
            Value::ServerError(e) => Reply::Error(match e.details() {
                Some(details) => format!("{} {details}", e.code()).into(),
                None => e.code().to_string().into(),
            }),
            other => {
                Reply::Error(format!("ERR relay: Redis answered {other:?}, which the relay does not carry").into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn six_integers_round_trip() {
        let r =
            rl_core::Reply { granted: 3, remaining: 7, retry_after_ms: 0, reset_after_ms: 30, limit: 10, binding: 1 };
        assert_eq!(Reply::six(r, true).module_reply(), Some(r));
        assert_eq!(Reply::six(r, false).module_reply().unwrap().granted, 1);
        assert_eq!(Reply::Array(vec![Reply::Int(1)]).module_reply(), None);
        assert_eq!(Reply::Int(1).module_reply(), None);
        let mut timed = Reply::six(r, false);
        assert_eq!(timed.module_time(), None);
        if let Reply::Array(items) = &mut timed {
            items.push(Reply::Int(1_764_650_000_300));
        }
        assert_eq!(
            (timed.module_reply().map(|r| r.remaining), timed.module_time()),
            (Some(r.remaining), Some(1_764_650_000_300))
        );
    }
}
