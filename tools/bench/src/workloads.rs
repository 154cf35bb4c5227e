//! What is measured: the module's commands next to INCR (the floor), the
//! seed design's Lua token bucket, a Stripe-style Lua in-flight limiter and
//! redis-cell's CL.THROTTLE.

/// The seed design's token bucket script (distributed-rate-limiter, step 2),
/// as a gateway without the module would run it.
pub const BUCKET_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local want = tonumber(ARGV[1])
local level, grant = {}, want
for i, key in ipairs(KEYS) do
  local rate, burst = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local s = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(s[1]) or burst
  local elapsed = math.max(0, now - (tonumber(s[2]) or now))
  level[i] = math.min(burst, tokens + elapsed * rate / 1000)
  grant = math.min(grant, math.floor(level[i]))
end
if grant < 1 then
  local wait = 0
  for i = 1, #KEYS do
    local rate = tonumber(ARGV[2 * i])
    wait = math.max(wait, math.ceil((1 - level[i]) * 1000 / rate))
  end
  return {0, 0, wait}
end
local left = math.huge
for i, key in ipairs(KEYS) do
  local rate, burst = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  redis.call('HSET', key, 'tokens', level[i] - grant, 'ts', now)
  redis.call('PEXPIRE', key, math.ceil(burst * 1000 / rate) + 1000)
  left = math.min(left, level[i] - grant)
end
return {grant, math.floor(left), 0}
"#;

/// Stripe's "concurrent requests limiter" as a script over a sorted set of
/// request ids scored by their deadline, on the server's clock:
/// `KEYS[1]`, `ARGV`: limit, timeout_ms, id. The key lives until its
/// latest deadline, so a lost release heals itself.
pub const ACQUIRE_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, timeout = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local count = redis.call('ZCARD', KEYS[1])
if count >= limit then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, count, tonumber(first[2]) - now}
end
local added = redis.call('ZADD', KEYS[1], now + timeout, ARGV[3])
redis.call('PEXPIRE', KEYS[1], timeout)
return {1, count + added, 0}
"#;

/// Its release: `KEYS[1]`, `ARGV[1]` the id.
pub const RELEASE_LUA: &str = "return redis.call('ZREM', KEYS[1], ARGV[1])";

/// Which server a workload runs on.
#[derive(Clone, Copy, PartialEq)]
pub enum On {
    Module,
    RedisCell,
}

pub struct Workload {
    /// Short name the targets refer to.
    pub id: &'static str,
    pub name: &'static str,
    pub on: On,
    /// One operation: one command, or a pair.
    pub commands: Vec<String>,
    /// The `cmdstat_` entries its commands count under.
    pub stats: Vec<&'static str>,
    /// Keys drawn from 100,000 subjects (warmed up before timing).
    pub spread: bool,
    /// Commands run once before, to drain what must refuse.
    pub setup: Vec<String>,
    /// See `load::Op::first`.
    pub first: Option<bool>,
}

/// Parameters that never run out (always allowed) and that are empty after
/// one call (always refused).
const ALLOW: &str = "1000000 1000000 1";
const DENY: &str = "1 1 63072000000";
const WINDOW_ALLOW: &str = "1000000000000 63072000000";
/// Always allowed too, but slow to refill, so that keys written once stay
/// (a key spread over 100,000 is updated in place, as in production).
const ALLOW_KEEP: &str = "100000000000 1 1000";

/// The script digests, as SCRIPT LOAD answers them.
pub struct Shas {
    pub bucket: String,
    pub acquire: String,
    pub release: String,
}

pub fn all(sha: &Shas) -> Vec<Workload> {
    let w = |id, name, on, commands: &[String], stats: &[&'static str], first: Option<bool>| Workload {
        id,
        name,
        on,
        commands: commands.to_vec(),
        stats: stats.to_vec(),
        spread: commands[0].contains("{r}"),
        setup: Vec::new(),
        first,
    };
    let drained = |mut w: Workload, setup: String| {
        w.setup.push(setup);
        w
    };
    let one = |s: String| vec![s];
    let take3 = |p: &str| format!("RL.TAKE 3 {{h}}a {{h}}b {{h}}c {ALLOW} {ALLOW} {p}");
    let spread3 =
        format!("RL.TAKE 3 rl:{{{{r}}}}:s rl:{{{{r}}}}:m rl:{{{{r}}}}:h {ALLOW_KEEP} {ALLOW_KEEP} {ALLOW_KEEP}");
    let cell_allow = "CL.THROTTLE {h}cell 1000000000 1000000 1 1".to_string();
    let cell_deny = "CL.THROTTLE {h}cellr 0 1 3600 1".to_string();
    let b = &sha.bucket;
    let lua_deny = format!("EVALSHA {b} 1 {{h}}luar 1 0.000001 1");
    let (m, c) = (On::Module, On::RedisCell);
    vec![
        w("incr", "INCR (the floor)", m, &one("INCR hot".into()), &["incr"], None),
        w(
            "take",
            "RL.TAKE, 1 bucket, allowed",
            m,
            &one(format!("RL.TAKE 1 {{h}}one {ALLOW}")),
            &["rl.take"],
            Some(true),
        ),
        drained(
            w(
                "take_refused",
                "RL.TAKE, 1 bucket, refused",
                m,
                &one(format!("RL.TAKE 1 {{h}}none {DENY}")),
                &["rl.take"],
                Some(false),
            ),
            format!("RL.TAKE 1 {{h}}none {DENY}"),
        ),
        w("take3", "RL.TAKE, 3 buckets, allowed", m, &one(take3(ALLOW)), &["rl.take"], Some(true)),
        drained(
            w("take3_refused", "RL.TAKE, 3 buckets, refused", m, &one(take3(DENY)), &["rl.take"], Some(false)),
            format!("RL.TAKE 1 {{h}}c {DENY}"),
        ),
        w(
            "take_spread",
            "RL.TAKE, 1 bucket, 100k subjects",
            m,
            &one(format!("RL.TAKE 1 rl:{{{{r}}}}:s {ALLOW_KEEP}")),
            &["rl.take"],
            Some(true),
        ),
        w("take3_spread", "RL.TAKE, 3 buckets, 100k subjects", m, &one(spread3), &["rl.take"], Some(true)),
        w(
            "lease",
            "RL.LEASE WANT 10, allowed",
            m,
            &one(format!("RL.LEASE 1 {{h}}lease {ALLOW} WANT 10")),
            &["rl.lease"],
            Some(true),
        ),
        w(
            "sliding",
            "RL.WINDOW SLIDING, allowed",
            m,
            &one(format!("RL.WINDOW 1 {{h}}sliding {WINDOW_ALLOW}")),
            &["rl.window"],
            Some(true),
        ),
        w(
            "fixed",
            "RL.WINDOW FIXED, allowed",
            m,
            &one(format!("RL.WINDOW 1 {{h}}fixed {WINDOW_ALLOW} FIXED")),
            &["rl.window"],
            Some(true),
        ),
        w(
            "exact_spread",
            "RL.WINDOW EXACT, limit 100, 100k subjects",
            m,
            &one("RL.WINDOW 1 rl:{{r}}:e 100 60000 EXACT".into()),
            &["rl.window"],
            Some(true),
        ),
        w(
            "exact_hot",
            "RL.WINDOW EXACT, limit 100, hot key (full log)",
            m,
            &one("RL.WINDOW 1 {h}exact 100 1000 EXACT".into()),
            &["rl.window"],
            None,
        ),
        w(
            "acquire_release",
            "RL.ACQUIRE + RL.RELEASE (limit 20, 5 s, ID)",
            m,
            &["RL.ACQUIRE 1 {h}flight 20 5000 ID {id}".into(), "RL.RELEASE 1 {h}flight ID {id}".into()],
            &["rl.acquire", "rl.release"],
            Some(true),
        ),
        w("throttle", "CL.THROTTLE (ours), allowed", m, &one(cell_allow.clone()), &["cl.throttle"], Some(false)),
        drained(
            w(
                "throttle_refused",
                "CL.THROTTLE (ours), refused",
                m,
                &one(cell_deny.clone()),
                &["cl.throttle"],
                Some(true),
            ),
            cell_deny.clone(),
        ),
        w("cell", "redis-cell CL.THROTTLE, allowed", c, &one(cell_allow), &["cl.throttle"], Some(false)),
        drained(
            w(
                "cell_refused",
                "redis-cell CL.THROTTLE, refused",
                c,
                &one(cell_deny.clone()),
                &["cl.throttle"],
                Some(true),
            ),
            cell_deny,
        ),
        w(
            "lua",
            "Lua bucket (EVALSHA), 1 key, allowed",
            m,
            &one(format!("EVALSHA {b} 1 {{h}}lua1 1 1000000000 1000000000")),
            &["evalsha"],
            Some(true),
        ),
        w(
            "lua2",
            "Lua bucket (EVALSHA), 2 keys, allowed",
            m,
            &one(format!("EVALSHA {b} 2 {{h}}lua2a {{h}}lua2b 1 1000000000 1000000000 1000000000 1000000000")),
            &["evalsha"],
            Some(true),
        ),
        drained(
            w(
                "lua_refused",
                "Lua bucket (EVALSHA), 1 key, refused",
                m,
                &one(lua_deny.clone()),
                &["evalsha"],
                Some(false),
            ),
            lua_deny,
        ),
        w(
            "lua_flight",
            "Lua in-flight (sorted set): acquire + release",
            m,
            &[
                format!("EVALSHA {} 1 {{h}}zflight 20 5000 {{id}}", sha.acquire),
                format!("EVALSHA {} 1 {{h}}zflight {{id}}", sha.release),
            ],
            &["evalsha"],
            Some(true),
        ),
    ]
}
