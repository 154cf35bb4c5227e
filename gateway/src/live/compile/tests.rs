//! The compiler's checks, rule by rule and set-wide, with every fault named.

use std::time::Duration;

use super::*;
use crate::live::snapshot::Scope;
use crate::live::spec::{LimitSpec, MatchSpec};
use crate::FailMode;

fn set(toml: &str) -> RuleSetSpec {
    RuleSetSpec::from_toml(toml).unwrap()
}

const BASE: &str = r#"
        [[rules]]
        id = "default"
        reason = "r"
        limits = [{ name = "s", rate = 10, per = "1s" }]
        [[rules]]
        id = "pro"
        match = { plan = "pro" }
        reason = "r"
        limits = [{ name = "s", rate = 20, per = "1s" }]
    "#;

#[test]
fn unchanged_rules_keep_their_local_state_across_versions() {
    let v1 = Snapshot::compile(&set(BASE), &[], 1).unwrap();
    let changed = BASE.replace("rate = 20", "rate = 30");
    let v2 = Snapshot::compile_with(&set(&changed), &[], 2, false, Some(&v1)).unwrap();
    let same = |id: &str| v1.rule(id).unwrap().policy().shares_state_with(v2.rule(id).unwrap().policy());
    assert!(same("default"), "same limits: same leases and deny cache");
    assert!(!same("pro"), "new limits start fresh");
}

/// `toml` (BASE, changed) with the pro rule's limits replaced by `limits`.
fn pro_limits(toml: &str, limits: &str) -> RuleSetSpec {
    set(&toml.replace("limits = [{ name = \"s\", rate = 20, per = \"1s\" }]", &format!("limits = [{limits}]")))
}

#[test]
fn in_flight_limits_compile_beside_the_rate_policy() {
    let limits =
        r#"{ name = "s", rate = 20, per = "1s" }, { name = "c", kind = "inflight", limit = 20, timeout = "30s" }"#;
    let spec = pro_limits(BASE, limits);
    let v1 = Snapshot::compile(&spec, &[], 1).unwrap();
    let pro = v1.rule("pro").unwrap();
    assert_eq!(pro.policy().rules().len(), 1, "the in-flight limit is not a rate");
    let inflight = pro.inflight().unwrap();
    assert_eq!(inflight.prefix(), "rl:pro");
    assert_eq!(inflight.keys("k").unwrap(), ["rl:pro:{k}:c"]);
    let rule = &inflight.rules()[0];
    assert_eq!((rule.name(), rule.limit(), rule.timeout()), ("c", 20, Duration::from_secs(30)));
    assert_eq!(rule.fail_mode(), FailMode::Open);
    assert!(v1.rule("default").unwrap().inflight().is_none());
    // The Lua backend has in-flight limits too (inflight.lua).
    assert!(Snapshot::compile_for(&spec, &[], 1, Backend::Lua).is_ok());
    let closed = BASE.replace("match = { plan = \"pro\" }", "match = { plan = \"pro\" }\nfail = \"closed\"");
    let closed = Snapshot::compile(&pro_limits(&closed, limits), &[], 1).unwrap();
    assert_eq!(closed.rule("pro").unwrap().inflight().unwrap().rules()[0].fail_mode(), FailMode::Closed);
}

#[test]
fn bad_in_flight_limits_are_named_in_the_module_words() {
    let e = |limits: &str| Snapshot::compile(&pro_limits(BASE, limits), &[], 1).unwrap_err().to_string();
    let rate = r#"{ name = "s", rate = 20, per = "1s" }, "#;
    let at = "rule 'pro' limit 'c': ";
    let cases = [
        (
            r#"{ name = "c", kind = "inflight", limit = 20, timeout = "800d" }"#,
            "timeout \"800d\": timeout_ms must be from 1 to 63072000000, got 69120000000",
        ),
        (
            r#"{ name = "c", kind = "inflight", limit = 20, timeout = "0s" }"#,
            "timeout \"0s\": timeout_ms must be from 1 to 63072000000, got 0",
        ),
        (r#"{ name = "c", kind = "inflight", limit = 0, timeout = "30s" }"#, "limit must be from 1 to 100000, got 0"),
        (
            r#"{ name = "c", kind = "inflight", limit = 100001, timeout = "30s" }"#,
            "limit must be from 1 to 100000, got 100001",
        ),
        (
            r#"{ name = "c", kind = "inflight", limit = 20, timeout = "soon" }"#,
            "timeout \"soon\" is not a duration like \"30s\"",
        ),
        (
            r#"{ name = "c", kind = "inflight", limit = 20, timeout = "1500us" }"#,
            "timeout must be whole milliseconds, got \"1500us\"",
        ),
        (r#"{ name = "c", kind = "inflight", limit = 20 }"#, "an in-flight limit needs timeout"),
        (r#"{ name = "c", kind = "inflight", timeout = "30s" }"#, "an in-flight limit needs limit (requests at once)"),
        (
            r#"{ name = "c", kind = "inflight", limit = 2, timeout = "3s", per = "1s" }"#,
            "an in-flight limit takes limit and timeout, not rate, burst or per",
        ),
        (
            r#"{ name = "c", rate = 2, per = "1s", timeout = "3s" }"#,
            "timeout is for in-flight limits (kind = \"inflight\")",
        ),
        (r#"{ name = "c", rate = 2 }"#, "per is required: the period"),
    ];
    for (limit, fault) in cases {
        let text = e(&format!("{rate}{limit}"));
        assert!(text.contains(&format!("{at}{fault}")), "{limit}: {text}");
    }
    // Both faults of one limit are named.
    let text = e(&format!("{rate}{{ name = \"c\", kind = \"inflight\", limit = 0, timeout = \"0s\" }}"));
    assert!(
        text.contains("limit must be from 1 to 100000, got 0") && text.contains("timeout_ms must be from 1"),
        "{text}"
    );
    // A rule may be in-flight only: it has no rates to ask.
    let only =
        Snapshot::compile(&pro_limits(BASE, r#"{ name = "c", kind = "inflight", limit = 2, timeout = "3s" }"#), &[], 1)
            .unwrap();
    let only = only.rule("pro").unwrap();
    assert!(!only.has_rates() && only.inflight().is_some());
    let mut announced = http::HeaderMap::new();
    crate::http::headers::announce(&mut announced, only.headers(), None);
    assert!(announced.is_empty(), "it announces no rate: {announced:?}");
    let text = e(&format!("{rate}{{ name = \"s\", kind = \"inflight\", limit = 2, timeout = \"3s\" }}"));
    assert!(text.contains("rule 'pro' limit 's': the name is used twice in the rule"), "{text}");
    let shadow = BASE.replace("match = { plan = \"pro\" }", "match = { plan = \"pro\" }\nmode = \"shadow\"").replace(
        "rate = 20, per = \"1s\" }",
        "rate = 20, per = \"1s\" }, { name = \"c\", kind = \"inflight\", limit = 2, timeout = \"3s\" }",
    );
    let text = Snapshot::compile(&set(&shadow), &[], 1).unwrap_err().to_string();
    assert!(text.contains("rule 'pro': in-flight limits are enforced only"), "{text}");
}

#[test]
fn set_wide_faults_are_named() {
    let e = |toml: &str, overrides: &[RuleSpec]| Snapshot::compile(&set(toml), overrides, 1).unwrap_err().to_string();
    let no_default = BASE.replacen("id = \"default\"", "id = \"d\"\nmatch = { plan = \"free\" }", 1);
    assert!(e(&no_default, &[]).contains("needs a default rule (no match) in enforce mode"));
    let twice = format!("{BASE}\n[[rules]]\nid = \"pro2\"\nmatch = {{ plan = \"pro\" }}\nreason = \"r\"\nlimits = [{{ name = \"s\", rate = 1, per = \"1s\" }}]");
    assert!(e(&twice, &[]).contains("rules 'pro' and 'pro2' both match plan \"pro\" in enforce mode"));
    let shadow_beside = twice.replace("id = \"pro2\"", "id = \"pro2\"\nmode = \"shadow\"");
    assert!(Snapshot::compile(&set(&shadow_beside), &[], 1).is_ok(), "one shadow rule beside the enforced one");
    let mixed = BASE.replace("match = { plan = \"pro\" }", "match = { plan = \"pro\", subject = \"k\" }");
    assert!(e(&mixed, &[]).contains("rule 'pro': match.subject stands alone"));
    let three = BASE
        .replace("match = { plan = \"pro\" }", "match = { plan = \"pro\", ip = \"10.0.0.0/8\", endpoint = \"GET /\" }");
    assert!(e(&three, &[]).contains("rule 'pro': match.ip goes with an endpoint or with a plan, not both"));
    let narrow = BASE.replace("match = { plan = \"pro\" }", "match = { ip = \"2001:db8::/80\" }");
    assert!(e(&narrow, &[]).contains("narrower than ipv6_prefix /64"));
    let expiring_default = BASE.replacen("reason = \"r\"", "reason = \"r\"\nexpires = \"2030-01-01T00:00:00Z\"", 1);
    assert!(e(&expiring_default, &[]).contains("rule 'default': the enforced default rule cannot expire"));
    let plan_override = RuleSpec {
        id: "o".into(),
        scope: MatchSpec { plan: Some("pro".into()), ..MatchSpec::default() },
        limits: set(BASE).rules[0].limits.clone(),
        reason: "r".into(),
        ..RuleSpec::default()
    };
    let text = e(BASE, &[plan_override]);
    assert!(text.contains("override 'o': an override matches one subject or one ip"), "{text}");
    assert!(text.contains("override 'o': an override needs expires"), "{text}");
}

#[test]
fn the_lua_backend_takes_windows_and_refuses_what_it_cannot_count() {
    let quota = BASE.replace(
        "{ name = \"s\", rate = 20, per = \"1s\" }",
        "{ name = \"d\", kind = \"quota\", limit = 5, per = \"1d\" }, { name = \"m\", kind = \"exact\", limit = 10000, per = \"1h\" }",
    );
    assert!(Snapshot::compile(&set(&quota), &[], 1).is_ok());
    assert!(Snapshot::compile_for(&set(&quota), &[], 1, Backend::Lua).is_ok(), "windows and quotas run on the scripts");
    let big = quota.replace("limit = 10000", "limit = 10001");
    assert!(Snapshot::compile(&set(&big), &[], 1).is_ok());
    let e = Snapshot::compile_for(&set(&big), &[], 1, Backend::Lua).unwrap_err().to_string();
    assert!(e.contains("rule 'pro': a limit the Lua backend cannot count exactly"), "{e}");
}

fn ip_override(net: &str, broad: bool) -> RuleSpec {
    RuleSpec {
        id: "o".into(),
        scope: MatchSpec { ip: Some(net.into()), ..MatchSpec::default() },
        limits: set(BASE).rules[0].limits.clone(),
        expires: Some("2999-01-01T00:00:00Z".into()),
        broad,
        reason: "r".into(),
        ..RuleSpec::default()
    }
}

#[test]
fn a_broad_network_override_needs_broad() {
    for net in ["0.0.0.0/0", "10.0.0.0/15", "::/0", "2001:db8::/31"] {
        let e = Snapshot::compile(&set(BASE), &[ip_override(net, false)], 1).unwrap_err().to_string();
        assert!(e.contains(&format!("override 'o': ip {net} is broader than /")) && e.contains("broad = true"), "{e}");
        assert!(Snapshot::compile(&set(BASE), &[ip_override(net, true)], 1).is_ok(), "{net} with broad");
    }
    for net in ["10.0.0.0/16", "2001:db8::/32"] {
        assert!(Snapshot::compile(&set(BASE), &[ip_override(net, false)], 1).is_ok(), "{net}");
    }
    // The bound is the set's to configure.
    let wide = format!("broad_ipv4_prefix = 8\n{BASE}");
    assert!(Snapshot::compile(&set(&wide), &[ip_override("10.0.0.0/8", false)], 1).is_ok());
    let file_rule = BASE.replace("match = { plan = \"pro\" }", "match = { ip = \"10.0.0.0/8\" }\nbroad = true");
    let e = Snapshot::compile(&set(&file_rule), &[], 1).unwrap_err().to_string();
    assert!(e.contains("rule 'pro': broad is for overrides"), "{e}");
}

#[test]
fn an_expired_rule_is_named_when_it_loads_and_when_it_blocks() {
    let expired = BASE.replace(
        "reason = \"r\"\n        limits = [{ name = \"s\", rate = 20",
        "reason = \"r\"\n        expires = \"2020-01-01T00:00:00Z\"\n        limits = [{ name = \"s\", rate = 20",
    );
    let snapshot = Snapshot::compile(&set(&expired), &[], 1).unwrap();
    assert_eq!(snapshot.warnings(), ["rule 'pro': expired at 2020-01-01T00:00:00Z: it never applies; remove it"]);
    assert!(Snapshot::compile(&set(BASE), &[], 1).unwrap().warnings().is_empty());
    let beside = format!("{expired}\n[[rules]]\nid = \"pro2\"\nmatch = {{ plan = \"pro\" }}\nreason = \"r\"\nlimits = [{{ name = \"s\", rate = 1, per = \"1s\" }}]");
    let e = Snapshot::compile(&set(&beside), &[], 1).unwrap_err().to_string();
    assert!(e.contains("rules 'pro' and 'pro2' both match plan \"pro\" in enforce mode: one rule of each mode per match; 'pro' expired at 2020-01-01T00:00:00Z: remove it"), "{e}");
}

#[test]
fn networks_are_compared_as_networks() {
    // One network written two ways: one match, refused as a pair.
    let two = BASE.replace("match = { plan = \"pro\" }", "match = { ip = \"10.1.2.3\" }")
            + "\n[[rules]]\nid = \"b\"\nmatch = { ip = \"10.1.2.3/32\" }\nreason = \"r\"\nlimits = [{ name = \"s\", rate = 1, per = \"1s\" }]";
    let e = Snapshot::compile(&set(&two), &[], 1).unwrap_err().to_string();
    assert!(e.contains("rules 'pro' and 'b' both match ip 10.1.2.3/32"), "{e}");
    // An IPv4-mapped network is the IPv4 network, whatever ipv6_prefix.
    let mapped = format!(
        "ipv6_prefix = 128\n{}",
        BASE.replace("match = { plan = \"pro\" }", "match = { ip = \"::ffff:10.0.0.0/104\" }")
    );
    let snapshot = Snapshot::compile(&set(&mapped), &[], 1).unwrap();
    assert_eq!(snapshot.rule("pro").unwrap().scope(), &Scope::Ip("10.0.0.0/8".parse().unwrap()));
    assert!(snapshot.warnings()[0].contains("is IPv4-mapped: it matches the IPv4 network 10.0.0.0/8"));
    let request = crate::live::Request::new().ip("10.9.9.9".parse().unwrap());
    assert_eq!(snapshot.matching(&request, SystemTime::now()).enforced.id(), "pro");
    let mapped_client = crate::live::Request::new().ip("::ffff:10.9.9.9".parse().unwrap());
    assert_eq!(snapshot.matching(&mapped_client, SystemTime::now()).enforced.id(), "pro");
    assert_eq!(parse_network("::ffff:10.1.2.3"), Some("10.1.2.3/32".parse().unwrap()));
    assert_eq!(parse_network("::/0"), Some("::/0".parse().unwrap()), "not mapped: stays IPv6");
}

#[test]
fn a_written_version_leaves_room_for_changes() {
    let at = |v: u64| RuleSetSpec { version: Some(v), ..set(BASE) };
    assert!(Snapshot::compile(&at(MAX_WRITTEN_VERSION), &[], MAX_WRITTEN_VERSION).is_ok());
    let e = Snapshot::compile(&at(MAX_VERSION), &[], MAX_VERSION).unwrap_err().to_string();
    assert!(
        e.contains("version 9007199254740991 leaves no room for later changes")
            && e.contains("at most version 4503599627370496"),
        "{e}"
    );
    // The store's own versions go on to the largest.
    assert!(Snapshot::compile(&set(BASE), &[], MAX_VERSION).is_ok());
}

#[test]
fn a_set_declared_for_lua_is_checked_for_lua_everywhere() {
    let lua = format!("backend = \"lua\"\n{BASE}");
    let quota = RuleSpec {
        id: "o".into(),
        scope: MatchSpec { subject: Some("k".into()), ..MatchSpec::default() },
        limits: vec![LimitSpec::parse_short("hourly=20000/1h,exact").unwrap()],
        expires: Some("2999-01-01T00:00:00Z".into()),
        reason: "r".into(),
        ..RuleSpec::default()
    };
    assert!(Snapshot::compile(&set(BASE), std::slice::from_ref(&quota), 1).is_ok(), "a module fleet");
    let e = Snapshot::compile(&set(&lua), std::slice::from_ref(&quota), 1).unwrap_err().to_string();
    assert!(e.starts_with("rule set rejected: override 'o': a limit the Lua backend cannot count exactly"), "{e}");
    assert!(e.contains("; the rule set declares backend = \"lua\""), "{e}");
    // burst x period above 2^52 ms: 2^40 tokens a day.
    let huge = lua.replace("rate = 20, per = \"1s\"", "rate = 1, burst = 1099511627776, per = \"1d\"");
    let e = Snapshot::compile(&set(&huge), &[], 1).unwrap_err().to_string();
    assert!(
        e.contains(
            "rule 'pro': a limit the Lua backend cannot count exactly: limit 's': limit x period_ms must be at most \
             2^52 on the Lua scripts: at most 52124995 per 86400000 ms, got 1099511627776"
        ),
        "{e}"
    );
    // An undeclared set on a Lua gateway says how to catch it earlier.
    let quota_rule = BASE.replace(
        "{ name = \"s\", rate = 20, per = \"1s\" }",
        "{ name = \"d\", kind = \"exact\", limit = 20000, per = \"1d\" }",
    );
    let e = Snapshot::compile_for(&set(&quota_rule), &[], 1, Backend::Lua).unwrap_err().to_string();
    assert!(e.contains("declare backend = \"lua\" in the rule file"), "{e}");
    let e = RuleSetSpec::from_toml("backend = \"redis\"").unwrap_err().to_string();
    assert!(e.contains("unknown variant `redis`, expected `module` or `lua`"), "{e}");
}

const GLOBAL: &str = r#"
        [[rules]]
        id = "default"
        reason = "one limit across regions"
        limits = [{ name = "s", rate = 100, per = "1s" }]
        global = { regions = ["eu", "us", "ap"], floor = 0.1, weights = [5, 3, 2] }
    "#;

#[test]
fn a_global_rule_compiles_with_its_split() {
    let snapshot = Snapshot::compile(&set(GLOBAL), &[], 1).unwrap();
    let global = snapshot.rule("default").unwrap().global().unwrap();
    assert_eq!((global.regions.len(), global.floor_ppm(), global.weights()), (3, 100_000, vec![5, 3, 2]));
    assert_eq!(global.to_string(), "eu 50%, us 30%, ap 20% (fixed split), floor 10%");
    let even = GLOBAL.replace(", floor = 0.1, weights = [5, 3, 2]", "");
    let snapshot = Snapshot::compile(&set(&even), &[], 1).unwrap();
    let global = snapshot.rule("default").unwrap().global().unwrap();
    assert_eq!((global.floor_ppm(), global.weights()), (0, vec![1, 1, 1]));
    assert_eq!(global.to_string(), "eu 33.3%, us 33.3%, ap 33.3% (fixed split), floor 0%");
    assert_eq!(
        crate::live::global_rules(&set(GLOBAL)),
        vec![("default".to_owned(), set(GLOBAL).rules[0].global.clone().unwrap())]
    );
    assert!(crate::live::global_rules(&set(BASE)).is_empty());
    assert!(Snapshot::compile(&set(BASE), &[], 1).unwrap().rule("default").unwrap().scaling.is_none());
}

#[test]
fn a_global_rules_scaled_policies_carry_over_while_it_is_unchanged() {
    let scaling = |s: &Snapshot| s.rule("default").unwrap().scaling.clone().unwrap();
    let v1 = Snapshot::compile(&set(GLOBAL), &[], 1).unwrap();
    let v2 = Snapshot::compile_with(&set(GLOBAL), &[], 2, false, Some(&v1)).unwrap();
    assert!(Arc::ptr_eq(&scaling(&v1), &scaling(&v2)), "same limits: same scaled policies and their leases");
    let changed = GLOBAL.replace("rate = 100", "rate = 200");
    let v3 = Snapshot::compile_with(&set(&changed), &[], 3, false, Some(&v2)).unwrap();
    assert!(!Arc::ptr_eq(&scaling(&v2), &scaling(&v3)), "new limits start fresh");
}

#[test]
fn bad_global_fields_are_named() {
    let faults = |from: &str, to: &str| {
        let text = GLOBAL.replace(from, to);
        Snapshot::compile(&set(&text), &[], 1).unwrap_err().to_string()
    };
    let split = "regions = [\"eu\", \"us\", \"ap\"], floor = 0.1, weights = [5, 3, 2]";
    for (to, fault) in [
        ("regions = []", "rule 'default': global.regions: name at least one region"),
        ("regions = [\"eu\", \"eu\"]", "global.regions: \"eu\" is named twice"),
        ("regions = [\"eu west\"]", "global.regions: region 1 "),
        (
            "regions = [\"eu\", \"us\", \"ap\"], floor = 0.4",
            "global.floor: the fraction each region always keeps is 0 to 1/3 (0.3333) for 3 regions, got 0.4",
        ),
        (
            "regions = [\"eu\", \"us\"], floor = -0.1",
            "global.floor: the fraction each region always keeps is 0 to 1/2 (0.5000) for 2 regions, got -0.1",
        ),
        (
            "regions = [\"eu\", \"us\", \"ap\"], weights = [1, 2]",
            "global.weights: one weight per region: 2 weights for 3 regions",
        ),
        (
            "regions = [\"eu\", \"us\"], weights = [0, 0]",
            "global.weights: all 0: at least one region must have a positive weight",
        ),
    ] {
        let e = faults(split, to);
        assert!(e.contains(fault), "{to}: {e}");
    }
    let typo = RuleSetSpec::from_toml(&GLOBAL.replace("weights", "weight")).unwrap_err().to_string();
    assert!(typo.contains("unknown field `weight`, expected one of `regions`, `floor`, `weights`"), "{typo}");
}

#[test]
fn a_global_rule_has_bucket_limits_and_is_no_override() {
    let quota = GLOBAL.replace(
            "limits = [{ name = \"s\", rate = 100, per = \"1s\" }]",
            "limits = [{ name = \"s\", rate = 100, per = \"1s\" }, { name = \"daily\", kind = \"quota\", limit = 1000, per = \"1d\" }]",
        );
    let e = Snapshot::compile(&set(&quota), &[], 1).unwrap_err().to_string();
    assert!(e.contains("rule 'default': global: limit 'daily' is a quota: a global rule's limits are buckets"), "{e}");
    let global = set(GLOBAL).rules[0].global.clone();
    let o = RuleSpec {
        id: "o".into(),
        scope: MatchSpec { subject: Some("acme".into()), ..MatchSpec::default() },
        limits: set(GLOBAL).rules[0].limits.clone(),
        expires: Some("2099-01-01T00:00:00Z".into()),
        reason: "r".into(),
        global,
        ..RuleSpec::default()
    };
    let e = Snapshot::compile(&set(GLOBAL), &[o], 1).unwrap_err().to_string();
    assert!(e.contains("override 'o': global: an override is enforced as written"), "{e}");
}
