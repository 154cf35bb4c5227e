//! The RLS front's config format: every case of envoyproxy/ratelimit's
//! config tests (test/config/config_test.go), on fixtures of our own in
//! tests/rls_config/, and the refusals its tests leave out. The same
//! files go through the binary and a gRPC client in tests/rls.rs.

use std::sync::Arc;

use rl_relay::rls::config::matching::{Found, Lookup};
use rl_relay::rls::config::{Algorithm, FailureMode, Limit, RlsConfig, Unit};

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/rls_config/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn load(names: &[&str], merge: bool) -> Result<RlsConfig, String> {
    let texts: Vec<(String, String)> = names.iter().map(|n| (n.to_string(), fixture(n))).collect();
    RlsConfig::from_texts(texts.iter().map(|(n, t)| (n.as_str(), t.as_str())), merge).map_err(|e| e.to_string())
}

fn inline(text: &str) -> Result<RlsConfig, String> {
    RlsConfig::from_texts([("inline.yaml", text)], false).map_err(|e| e.to_string())
}

fn refusal(names: &[&str], merge: bool) -> String {
    match load(names, merge) {
        Ok(_) => panic!("{names:?} loaded"),
        Err(e) => e,
    }
}

fn inline_refusal(text: &str) -> String {
    match inline(text) {
        Ok(_) => panic!("loaded:\n{text}"),
        Err(e) => e,
    }
}

/// The limit found for `entries`, if any.
fn find(config: &RlsConfig, domain: &str, entries: &[(&str, &str)]) -> Option<Found> {
    match config.lookup(domain, entries, None) {
        Lookup::Found(found) => Some(found),
        Lookup::NoLimit | Lookup::UnknownDomain => None,
    }
}

/// (requests_per_unit, unit, name, stats key) of the limit found.
fn limit_of(config: &RlsConfig, entries: &[(&str, &str)]) -> Option<(u32, Unit, String, String)> {
    let found = find(config, "test-domain", entries)?;
    Some((found.limit.requests_per_unit, found.limit.unit.unwrap(), found.limit.name.clone(), found.stats_key))
}

fn stats_key(config: &RlsConfig, domain: &str, entries: &[(&str, &str)]) -> String {
    find(config, domain, entries).unwrap_or_else(|| panic!("no limit for {entries:?}")).stats_key
}

// ---- refusals: config_test.go's, in its words after the file, the line and the path

#[test]
fn empty_domain() {
    assert_eq!(
        refusal(&["empty_domain.yaml"], false),
        "empty_domain.yaml:1: domain: config file cannot have empty domain"
    );
}

#[test]
fn duplicate_domain() {
    assert_eq!(
        refusal(&["basic_config.yaml", "duplicate_domain.yaml"], false),
        "duplicate_domain.yaml:2: domain: duplicate domain 'test-domain' in config file (also in basic_config.yaml: \
         merge the files, or start with --rls-merge-domains)"
    );
}

#[test]
fn empty_key() {
    assert_eq!(refusal(&["empty_key.yaml"], false), "empty_key.yaml:3: descriptors[0]: descriptor has empty key");
}

#[test]
fn duplicate_key() {
    assert_eq!(
        refusal(&["duplicate_key.yaml"], false),
        "duplicate_key.yaml:5: descriptors[1]: duplicate descriptor composite key 'test-domain.key1_value1'"
    );
}

#[test]
fn duplicate_key_across_merged_files() {
    assert_eq!(
        refusal(&["merge_domain_key1.yaml", "merge_domain_key1.yaml"], true),
        "merge_domain_key1.yaml:3: descriptors[0]: duplicate descriptor composite key 'test-domain.key1_value1'"
    );
}

#[test]
fn bad_limit_unit() {
    assert_eq!(
        refusal(&["bad_limit_unit.yaml"], false),
        "bad_limit_unit.yaml:6: descriptors[0].rate_limit.unit: invalid rate limit unit 'foo'"
    );
}

#[test]
fn replaces_self() {
    assert_eq!(
        refusal(&["replaces_self.yaml"], false),
        "replaces_self.yaml:10: descriptors[0].descriptors[0].rate_limit.replaces[0]: replaces should not contain \
         name of same descriptor"
    );
}

#[test]
fn replaces_empty() {
    assert_eq!(
        refusal(&["replaces_empty.yaml"], false),
        "replaces_empty.yaml:10: descriptors[0].descriptors[0].rate_limit.replaces[0]: should not have an empty \
         replaces entry"
    );
}

#[test]
fn bad_yaml() {
    assert_eq!(
        refusal(&["bad_yaml.yaml"], false),
        "bad_yaml.yaml:1: error loading config file: while scanning a quoted scalar, found unexpected end of stream"
    );
}

#[test]
fn misspelled_keys() {
    assert_eq!(
        refusal(&["misspelled_key.yaml"], false),
        "misspelled_key.yaml:5: descriptors[0].ratelimit: config error, unknown key 'ratelimit'"
    );
    assert_eq!(
        refusal(&["misspelled_key2.yaml"], false),
        "misspelled_key2.yaml:7: descriptors[0].rate_limit.requestsperunit: config error, unknown key \
         'requestsperunit'"
    );
}

#[test]
fn non_string_key() {
    assert_eq!(
        refusal(&["non_string_key.yaml"], false),
        "non_string_key.yaml:1: config error, key is not of type string: 0.25"
    );
}

#[test]
fn non_map_list() {
    assert_eq!(
        refusal(&["non_map_list.yaml"], false),
        "non_map_list.yaml:3: descriptors[0]: config error, yaml file contains list of type other than map: a"
    );
}

#[test]
fn unlimited_with_rate_limit_unit() {
    assert_eq!(
        refusal(&["unlimited_with_unit.yaml"], false),
        "unlimited_with_unit.yaml:6: descriptors[0].rate_limit.unit: should not specify rate limit unit when unlimited"
    );
}

// ---- refusals envoyproxy/ratelimit makes that its tests leave out

const HEAD: &str = "domain: d\ndescriptors:\n  - key: k\n";

#[test]
fn share_threshold_needs_a_wildcard() {
    let e = inline_refusal(&format!("{HEAD}    value: v\n    share_threshold: true\n"));
    assert_eq!(
        e,
        "inline.yaml:3: descriptors[0]: share_threshold can only be used with wildcard values (containing '*'), but \
         found key 'k_v'"
    );
}

#[test]
fn values_that_are_not_strings_integers_or_booleans() {
    let e = inline_refusal(&format!("{HEAD}    rate_limit: {{ unit: second, requests_per_unit: 1.5 }}\n"));
    assert_eq!(
        e,
        "inline.yaml:4: descriptors[0].rate_limit.requests_per_unit: error checking config: 1.5 is not a string, an \
         integer or a boolean"
    );
}

#[test]
fn values_of_the_wrong_type() {
    for (body, expected) in [
        (
            "    rate_limit: { unit: second, requests_per_unit: abc }\n",
            "inline.yaml:4: descriptors[0].rate_limit.requests_per_unit: must be an integer from 0 to 4294967295, got \
             'abc'",
        ),
        (
            "    rate_limit: { unit: second, requests_per_unit: -1 }\n",
            "inline.yaml:4: descriptors[0].rate_limit.requests_per_unit: must be an integer from 0 to 4294967295, got \
             '-1'",
        ),
        (
            "    rate_limit: { unit: second, requests_per_unit: 4294967296 }\n",
            "inline.yaml:4: descriptors[0].rate_limit.requests_per_unit: must be an integer from 0 to 4294967295, got \
             '4294967296'",
        ),
        ("    descriptors: foo\n", "inline.yaml:4: descriptors[0].descriptors: must be a list, got foo"),
        (
            "    rate_limit:\n      - unit: second\n",
            "inline.yaml:5: descriptors[0].rate_limit: must be a map, got a list",
        ),
        ("    shadow_mode: \"x\"\n", "inline.yaml:4: descriptors[0].shadow_mode: must be true or false, got 'x'"),
        ("    key: k2\n", "inline.yaml:4: descriptors[0].key: config error, key 'key' is given twice"),
    ] {
        assert_eq!(inline_refusal(&format!("{HEAD}{body}")), expected, "{body}");
    }
    assert_eq!(
        inline_refusal("domain: [a, b]\n"),
        "inline.yaml:1: domain[0]: config error, yaml file contains list of type other than map: a"
    );
    assert_eq!(inline_refusal("domain: {a: b}\n"), "inline.yaml:1: domain.a: config error, unknown key 'a'");
    assert_eq!(inline_refusal("domain: {key: b}\n"), "inline.yaml:1: domain: must be a string, got a map");
}

#[test]
fn the_file_must_be_a_map_and_lists_must_hold_maps() {
    assert_eq!(
        inline_refusal("- domain: d\n"),
        "inline.yaml:1: error loading config file: the file holds !!seq, not a map of domain and descriptors"
    );
    assert_eq!(
        inline_refusal("just text\n"),
        "inline.yaml:1: error loading config file: the file holds !!str, not a map of domain and descriptors"
    );
    assert_eq!(
        inline_refusal("domain: d\ndescriptors:\n  - - key: k\n"),
        "inline.yaml:3: descriptors[0]: config error, yaml file contains list of type other than map: a list"
    );
}

#[test]
fn a_misspelt_key_deep_down() {
    let text =
        "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        descriptors:\n          - \
                key: c\n            rate_limit: { unit: second, requests_per_unit: 1, nmae: x }\n";
    assert_eq!(
        inline_refusal(text),
        "inline.yaml:8: descriptors[0].descriptors[0].descriptors[0].rate_limit.nmae: config error, unknown key 'nmae'"
    );
}

#[test]
fn a_missing_unit() {
    assert_eq!(
        inline_refusal(&format!("{HEAD}    rate_limit: {{ requests_per_unit: 1 }}\n")),
        "inline.yaml:4: descriptors[0].rate_limit.unit: invalid rate limit unit ''"
    );
}

#[test]
fn an_unlimited_limit_with_no_unit_or_a_bad_one_loads() {
    for body in ["{ unlimited: true, requests_per_unit: 5 }", "{ unlimited: true, unit: foo }"] {
        let config = inline(&format!("{HEAD}    rate_limit: {body}\n")).unwrap();
        assert!(find(&config, "d", &[("k", "x")]).unwrap().limit.unlimited, "{body}");
    }
}

#[test]
fn a_replaces_that_names_no_limit_loads() {
    inline(&format!("{HEAD}    rate_limit: {{ unit: second, requests_per_unit: 1, replaces: [{{name: nothing}}] }}\n"))
        .unwrap();
}

// ---- refusals of ours (envoyproxy/ratelimit reads on without a word; docs/envoy.md)

#[test]
fn a_valid_key_in_the_wrong_place_is_refused() {
    assert_eq!(
        inline_refusal(&format!("{HEAD}    rate_limit: {{ unit: second, requests_per_unit: 1, shadow_mode: true }}\n")),
        "inline.yaml:4: descriptors[0].rate_limit.shadow_mode: config error, key 'shadow_mode' belongs in a \
         descriptor, not in a rate_limit (envoyproxy/ratelimit ignores it here; rl-relay refuses it)"
    );
    assert_eq!(
        inline_refusal(&format!("{HEAD}    unit: second\n")),
        "inline.yaml:4: descriptors[0].unit: config error, key 'unit' belongs in a rate_limit, not in a descriptor \
         (envoyproxy/ratelimit ignores it here; rl-relay refuses it)"
    );
    assert_eq!(
        inline_refusal("domain: d\nkey: k\n"),
        "inline.yaml:2: key: config error, key 'key' belongs in a descriptor, not at the top of the file \
         (envoyproxy/ratelimit ignores it here; rl-relay refuses it)"
    );
}

#[test]
fn a_key_given_twice_is_refused() {
    assert_eq!(
        inline_refusal(&format!("{HEAD}    rate_limit: {{ unit: second, unit: minute }}\n")),
        "inline.yaml:4: descriptors[0].rate_limit.unit: config error, key 'unit' is given twice"
    );
}

#[test]
fn quota_mode_and_metadata_are_read_as_envoyproxy_ratelimit_reads_them() {
    let config = load(&["example/config.yaml", "example/example.yaml"], false).unwrap();
    let found = find(&config, "rl", &[("service", "service_1")]).unwrap();
    assert!(found.limit.quota_mode);
    let metadata = found.limit.metadata.as_ref().expect("its metadata");
    assert!(metadata.0.fields.contains_key("service_with_quota"), "{metadata:?}");
    let plain = find(&config, "rl", &[("foo", "x")]).unwrap();
    assert!(!plain.limit.quota_mode && plain.limit.metadata.is_none());
}

#[test]
fn a_second_document_and_bad_metadata_are_refused() {
    let e = inline_refusal("domain: d\n---\ndomain: e\n");
    assert_eq!(e, "inline.yaml:3: error loading config file: a second YAML document ('---'): a config file holds one");
    let e = inline_refusal(&format!("{HEAD}    metadata: {{ 1: x }}\n"));
    assert_eq!(e, "inline.yaml:4: descriptors[0].metadata: error parsing metadata: key 1 is not a string");
    let e = inline_refusal(&format!("{HEAD}    metadata: text\n"));
    assert_eq!(e, "inline.yaml:4: descriptors[0].metadata: error parsing metadata: must be a map, got text");
}

// ---- our extensions

#[test]
fn extensions_load_and_their_mistakes_are_refused() {
    let config = inline(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 10, algorithm: \
         token_bucket, burst: 20, failure_mode: deny }\n  - key: b\n    rate_limit: { unit: minute, requests_per_unit: \
         5, algorithm: sliding_window }\n  - key: c\n    rate_limit: { unit: hour, requests_per_unit: 5, algorithm: \
         exact_window }\n  - key: e\n    rate_limit: { unit: hour, requests_per_unit: 5, algorithm: fixed_window, \
         failure_mode: allow }\n",
    )
    .unwrap();
    let a = find(&config, "d", &[("a", "1")]).unwrap().limit;
    assert_eq!((a.algorithm, a.burst, a.failure_mode), (Algorithm::TokenBucket, Some(20), FailureMode::Deny));
    assert_eq!(find(&config, "d", &[("b", "1")]).unwrap().limit.algorithm, Algorithm::SlidingWindow);
    assert_eq!(find(&config, "d", &[("c", "1")]).unwrap().limit.algorithm, Algorithm::ExactWindow);
    let e = find(&config, "d", &[("e", "1")]).unwrap().limit;
    assert_eq!((e.algorithm, e.failure_mode), (Algorithm::FixedWindow, FailureMode::Allow));

    for (body, expected) in [
        (
            "{ unit: second, requests_per_unit: 1, algorithm: leaky }",
            "inline.yaml:4: descriptors[0].rate_limit.algorithm: unknown algorithm 'leaky' (fixed_window, the \
             default; token_bucket; sliding_window; exact_window; concurrency)",
        ),
        (
            "{ unit: second, requests_per_unit: 1, burst: 5 }",
            "inline.yaml:4: descriptors[0].rate_limit.burst: burst is for algorithm: token_bucket, not fixed_window",
        ),
        (
            "{ unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 0 }",
            "inline.yaml:4: descriptors[0].rate_limit.burst: burst must be at least 1",
        ),
        (
            "{ unit: second, requests_per_unit: 1, failure_mode: closed }",
            "inline.yaml:4: descriptors[0].rate_limit.failure_mode: unknown failure_mode 'closed' (allow, the \
             default, or deny)",
        ),
        (
            "{ unit: minute, requests_per_unit: 20, algorithm: concurrency }",
            "inline.yaml:4: descriptors[0].rate_limit.algorithm: algorithm: concurrency names a request's slot by \
             the descriptor's last entry (its request id): put it on a nested descriptor (key: request_id under the \
             subject's)",
        ),
        (
            "{ unlimited: true, algorithm: token_bucket }",
            "inline.yaml:4: descriptors[0].rate_limit.algorithm: should not specify an algorithm when unlimited",
        ),
        (
            "{ unit: hour, requests_per_unit: 1000001, algorithm: exact_window }",
            "inline.yaml:4: descriptors[0].rate_limit.requests_per_unit: an exact_window holds at most 1000000 \
             requests (and at most the module's max-log-limit, 10000 unless configured), got 1000001",
        ),
    ] {
        assert_eq!(inline_refusal(&format!("{HEAD}    rate_limit: {body}\n")), expected, "{body}");
    }
}

#[test]
fn scalars_are_read_as_yaml_1_1_reads_them() {
    // yaml.v2 gives a string field the scalar as written, and yes/on are
    // booleans.
    let config = inline("domain: d\ndescriptors:\n  - key: k\n    value: 0123\n    shadow_mode: yes\n    rate_limit: { unit: Second, requests_per_unit: 0x10 }\n").unwrap();
    let found = find(&config, "d", &[("k", "0123")]).unwrap();
    assert_eq!(
        (found.limit.requests_per_unit, found.limit.unit, found.limit.shadow_mode),
        (16, Some(Unit::Second), true)
    );
    let config =
        inline("domain: 42\ndescriptors:\n  - key: true\n    rate_limit: { unit: week, requests_per_unit: 1 }\n")
            .unwrap();
    assert_eq!(find(&config, "42", &[("true", "x")]).unwrap().limit.unit, Some(Unit::Week));
}

// ---- lookups (TestBasicConfig and the others)

#[test]
fn basic_config_lookups() {
    let config = load(&["basic_config.yaml"], false).unwrap();
    assert_eq!(config.lookup("foo_domain", &[], None), Lookup::UnknownDomain);
    assert_eq!(config.lookup("test-domain", &[], None), Lookup::NoLimit);
    let none: &[&[(&str, &str)]] = &[
        &[("key1", "something")],
        &[("key1", "value1")],
        &[("key2", "value2"), ("subkey", "subvalue")],
        &[("key5", "value5"), ("subkey5", "subvalue")],
        &[("key2", "value3")],
    ];
    for entries in none {
        assert_eq!(config.lookup("test-domain", entries, None), Lookup::NoLimit, "{entries:?}");
    }
    let s = |t: &str| t.to_string();
    for (entries, expected) in [
        (
            &[("key1", "value1"), ("subkey1", "something")][..],
            (5, Unit::Second, s(""), s("test-domain.key1_value1.subkey1")),
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")],
            (10, Unit::Second, s(""), s("test-domain.key1_value1.subkey1_subvalue1")),
        ),
        (&[("key2", "something")], (20, Unit::Minute, s(""), s("test-domain.key2"))),
        (&[("key2", "value2")], (30, Unit::Minute, s(""), s("test-domain.key2_value2"))),
        (&[("key3", "foo")], (1, Unit::Hour, s(""), s("test-domain.key3"))),
        (&[("key4", "foo")], (1, Unit::Day, s("key4_rate_limit"), s("test-domain.key4"))),
        (&[("key7", "unspecified_value")], (70, Unit::Minute, s(""), s("test-domain.key7_unspecified_value"))),
        (&[("key7", "another_value")], (70, Unit::Minute, s(""), s("test-domain.key7_another_value"))),
    ] {
        assert_eq!(limit_of(&config, entries), Some(expected), "{entries:?}");
    }
    let unlimited = find(&config, "test-domain", &[("key6", "foo")]).unwrap();
    assert!(unlimited.limit.unlimited);
    assert_eq!(unlimited.stats_key, "test-domain.key6");
}

#[test]
fn domain_merge() {
    let config = load(&["merge_domain_key1.yaml", "merge_domain_key2.yaml"], true).unwrap();
    assert_eq!(config.lookup("foo_domain", &[], None), Lookup::UnknownDomain);
    assert_eq!(config.lookup("test-domain", &[], None), Lookup::NoLimit);
    assert_eq!(limit_of(&config, &[("key1", "value1")]).unwrap().0, 10);
    assert_eq!(limit_of(&config, &[("key2", "value2")]).unwrap().0, 20);
    // Without the flag the same two files are refused.
    assert!(refusal(&["merge_domain_key1.yaml", "merge_domain_key2.yaml"], false).contains("duplicate domain"));
}

#[test]
fn limit_override() {
    let config = load(&["basic_config.yaml"], false).unwrap();
    assert_eq!(config.lookup("foo_domain", &[], Some((10, Unit::Day))), Lookup::UnknownDomain);
    let over = |entries: &[(&str, &str)], rpu, unit| match config.lookup("test-domain", entries, Some((rpu, unit))) {
        Lookup::Found(f) => f,
        other => panic!("{other:?}"),
    };
    let f = over(&[("key1", "value1"), ("subkey1", "something")], 10, Unit::Day);
    assert_eq!(*f.limit, Limit::override_of(10, Unit::Day, "test-domain.key1_value1.subkey1_something".into()));
    assert_eq!(f.stats_key, "test-domain.key1_value1.subkey1_something");
    let f = over(&[("key1", "value1"), ("subkey1", "something")], 42, Unit::Hour);
    assert_eq!((f.limit.requests_per_unit, f.limit.unit), (42, Some(Unit::Hour)));
    assert_eq!(f.stats_key, "test-domain.key1_value1.subkey1_something");
    let f = over(&[("key1", "value1"), ("subkey1", "something_else")], 42, Unit::Hour);
    assert_eq!(f.stats_key, "test-domain.key1_value1.subkey1_something_else");
    // Even a descriptor the tree does not know, and one with an empty value.
    let f = over(&[("nothing", ""), ("here", "x")], 1, Unit::Second);
    assert_eq!(f.stats_key, "test-domain.nothing.here_x");
    assert!(!f.limit.shadow_mode && f.limit.name.is_empty());
}

#[test]
fn shadow_mode_config() {
    let config = load(&["shadowmode_config.yaml"], false).unwrap();
    let shadow = |entries: &[(&str, &str)]| {
        let f = find(&config, "test-domain", entries).unwrap();
        (f.limit.requests_per_unit, f.limit.shadow_mode, f.stats_key)
    };
    assert_eq!(
        shadow(&[("key1", "value1"), ("subkey1", "something")]),
        (5, false, "test-domain.key1_value1.subkey1".into())
    );
    assert_eq!(
        shadow(&[("key1", "value1"), ("subkey1", "subvalue1")]),
        (10, true, "test-domain.key1_value1.subkey1_subvalue1".into())
    );
    assert_eq!(shadow(&[("key2", "something")]), (20, true, "test-domain.key2".into()));
    assert_eq!(shadow(&[("key2", "value2")]), (30, false, "test-domain.key2_value2".into()));
}

#[test]
fn wildcard_config() {
    let config = load(&["wildcard.yaml"], false).unwrap();
    let same = |a: &[(&str, &str)], b: &[(&str, &str)], key: &str| {
        let (fa, fb) = (find(&config, "test-domain", a).unwrap(), find(&config, "test-domain", b).unwrap());
        assert!(Arc::ptr_eq(&fa.limit, &fb.limit), "{a:?} and {b:?}");
        assert_eq!((fa.stats_key.as_str(), fb.stats_key.as_str()), (key, key));
    };
    same(&[("noVal", "foo1")], &[("noVal", "foo2")], "test-domain.noVal");
    same(&[("wild", "foo1")], &[("wild", "foo2")], "test-domain.wild_foo*");
    assert_eq!(find(&config, "test-domain", &[("wild", "foo1")]).unwrap().limit.full_key, "test-domain.wild_foo*");
    assert_eq!(
        stats_key(&config, "test-domain", &[("nestedWild", "val1"), ("wild", "goo2")]),
        "test-domain.nestedWild_val1.wild_goo*"
    );
    assert!(find(&config, "test-domain", &[("wild", "bar")]).is_none());
    assert!(find(&config, "test-domain", &[("noWild", "foo1")]).is_none());
    same(&[("midWild", "barab")], &[("midWild", "bar123b")], "test-domain.midWild_bar*b");
    same(&[("midWild", "barb")], &[("midWild", "barab")], "test-domain.midWild_bar*b");
    assert!(find(&config, "test-domain", &[("midWild", "bara")]).is_none());
    assert!(find(&config, "test-domain", &[("midWild", "xbarb")]).is_none());
    same(&[("multiWild", "foo123bar456baz")], &[("multiWild", "foobarbaz")], "test-domain.multiWild_foo*bar*baz");
    assert!(find(&config, "test-domain", &[("multiWild", "foo123baz")]).is_none());
    assert!(find(&config, "test-domain", &[("multiWild", "bar456baz")]).is_none());
}

#[test]
fn the_first_matching_wildcard_in_file_order_wins() {
    let config = inline(
        "domain: d\ndescriptors:\n  - key: p\n    value: a*\n    rate_limit: { unit: second, requests_per_unit: 1 \
         }\n  - key: p\n    value: ab*\n    rate_limit: { unit: second, requests_per_unit: 2 }\n  - key: p\n    value: \
         abc\n    rate_limit: { unit: second, requests_per_unit: 3 }\n",
    )
    .unwrap();
    let rpu = |v: &str| find(&config, "d", &[("p", v)]).unwrap().limit.requests_per_unit;
    assert_eq!((rpu("abc"), rpu("abd"), rpu("ax")), (3, 1, 1), "exact first, then the first pattern, not the longest");
}

#[test]
fn an_entry_is_matched_on_its_key_and_value_never_on_the_two_joined() {
    // envoyproxy/ratelimit looks up "a_b" for the entry (a, b), and finds
    // the rule of key a_b: the entry got 1,000 a minute where a allows 10.
    let config = inline(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: minute, requests_per_unit: 10 }\n  - key: a_b\n    \
         rate_limit: { unit: minute, requests_per_unit: 1000 }\n  - key: p\n    value: q*\n    rate_limit: { unit: \
         minute, requests_per_unit: 3 }\n  - key: x_y\n    value: z\n    rate_limit: { unit: minute, requests_per_unit: 7 \
         }\n",
    )
    .unwrap();
    let rpu = |entries: &[(&str, &str)]| find(&config, "d", entries).map(|f| f.limit.requests_per_unit);
    assert_eq!(rpu(&[("a", "b")]), Some(10));
    assert_eq!(rpu(&[("a", "c")]), Some(10));
    assert_eq!(rpu(&[("a_b", "anything")]), Some(1000));
    assert_eq!(rpu(&[("a_b", "")]), Some(1000));
    assert_eq!(find(&config, "d", &[("a", "b")]).unwrap().stats_key, "d.a");
    // A pattern matches values of its own key only ("p_q*" took (p_q, x)).
    assert_eq!(rpu(&[("p", "q1")]), Some(3));
    assert_eq!(rpu(&[("p_q", "x")]), None);
    assert_eq!(rpu(&[("x_y", "z")]), Some(7));
    assert_eq!(rpu(&[("x", "y_z")]), None);
    // Two descriptors whose joined names collide are still refused, as
    // envoyproxy/ratelimit refuses them (their statistics are one name);
    // the message names the other.
    let both = |first: &str, second: &str| {
        inline_refusal(&format!(
            "domain: d\ndescriptors:\n  - {first}\n    rate_limit: {{ unit: minute, requests_per_unit: 1 }}\n  - \
             {second}\n    rate_limit: {{ unit: minute, requests_per_unit: 2 }}\n"
        ))
    };
    assert_eq!(
        both("key: a\n    value: b", "key: a_b"),
        "inline.yaml:6: descriptors[1]: duplicate descriptor composite key 'd.a_b' (as key 'a' with value 'b')"
    );
    assert_eq!(
        both("key: a_b", "key: a\n    value: b"),
        "inline.yaml:5: descriptors[1]: duplicate descriptor composite key 'd.a_b' (as key 'a_b')"
    );
    assert_eq!(
        both("key: a_b\n    value: c", "key: a\n    value: b_c"),
        "inline.yaml:6: descriptors[1]: duplicate descriptor composite key 'd.a_b_c' (as key 'a_b' with value 'c')"
    );
    // A '*' in a key is refused: a wildcard is for values.
    assert_eq!(
        both("key: a*", "key: b"),
        "inline.yaml:3: descriptors[0]: a key cannot hold '*', got 'a*' (a wildcard is for values: value: 'foo*')"
    );
}

#[test]
fn detailed_metric() {
    let config = |detailed1: bool, detailed2: bool| {
        inline(&format!(
            "domain: nested\ndescriptors:\n  - key: key-1\n    detailed_metric: {detailed1}\n    rate_limit: {{ unit: \
             minute, requests_per_unit: 100 }}\n    descriptors:\n      - key: key-2\n        detailed_metric: \
             {detailed2}\n        rate_limit: {{ unit: minute, requests_per_unit: 5 }}\n"
        ))
        .unwrap()
    };
    assert_eq!(stats_key(&config(true, false), "nested", &[("key-1", "value-1")]), "nested.key-1_value-1");
    assert_eq!(stats_key(&config(false, false), "nested", &[("key-1", "value-1")]), "nested.key-1");
    let two = [("key-1", "value-1"), ("key-2", "value-2")];
    assert_eq!(stats_key(&config(true, true), "nested", &two), "nested.key-1_value-1.key-2_value-2");
    assert_eq!(stats_key(&config(false, false), "nested", &two), "nested.key-1.key-2");

    let realistic = inline(
        "domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 500 }
  - key: key_1
    value: some-value-for-key-1
    rate_limit: { unit: minute, requests_per_unit: 500 }
  - key: key_2
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 5000 }
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: key_2
    value: specific-id
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 50000 }
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: { unit: minute, requests_per_unit: 100 }
",
    )
    .unwrap();
    assert_eq!(stats_key(&realistic, "nested", &[("key_1", "value-for-key-1")]), "nested.key_1_value-for-key-1");
    assert_eq!(stats_key(&realistic, "nested", &[("key_2", "key-2-value")]), "nested.key_2_key-2-value");
    assert_eq!(
        stats_key(&realistic, "nested", &[("key_2", "key-2-value"), ("key_3", "requested-key3-value")]),
        "nested.key_2_key-2-value.key_3_requested-key3-value"
    );
}

const CHAIN: &str = "domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: { unit: minute, requests_per_unit: 60 }
";

#[test]
fn value_to_metric() {
    let chain = inline(CHAIN).unwrap();
    let request = [("route", "draw"), ("http_method", "GET"), ("subject_id", "123")];
    assert_eq!(stats_key(&chain, "domain", &request), "domain.route_draw.http_method_GET.subject_id");

    let two = inline("domain: d\ndescriptors:\n  - key: k1\n    value_to_metric: true\n    descriptors:\n      - key: k2\n        rate_limit: { unit: second, requests_per_unit: 1 }\n").unwrap();
    assert_eq!(stats_key(&two, "d", &[("k1", "A"), ("k2", "foo")]), "d.k1_A.k2");

    let mid = inline("domain: d\ndescriptors:\n  - key: k1\n    descriptors:\n      - key: k2\n        value_to_metric: true\n        descriptors:\n          - key: k3\n            rate_limit: { unit: second, requests_per_unit: 1 }\n").unwrap();
    assert_eq!(stats_key(&mid, "d", &[("k1", "X"), ("k2", "Y"), ("k3", "Z")]), "d.k1.k2_Y.k3");

    let plain = inline("domain: d\ndescriptors:\n  - key: k1\n    descriptors:\n      - key: k2\n        rate_limit: { unit: second, requests_per_unit: 1 }\n").unwrap();
    assert_eq!(stats_key(&plain, "d", &[("k1", "X"), ("k2", "Y")]), "d.k1.k2");

    let detailed =
        inline(&CHAIN.replace(
            "          - key: subject_id\n",
            "          - key: subject_id\n            detailed_metric: true\n",
        ))
        .unwrap();
    assert_eq!(stats_key(&detailed, "domain", &request), "domain.route_draw.http_method_GET.subject_id_123");

    let configured = inline(
        "domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: { unit: minute, requests_per_unit: 60 }
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: { unit: minute, requests_per_unit: 30 }
",
    )
    .unwrap();
    let get = find(&configured, "test-domain", &[("route", "api"), ("http_method", "GET"), ("subject_id", "user123")])
        .unwrap();
    assert_eq!(
        (get.limit.requests_per_unit, get.stats_key.as_str()),
        (60, "test-domain.route_api.http_method_GET.subject_id")
    );
    let post =
        find(&configured, "test-domain", &[("route", "api"), ("http_method", "POST"), ("subject_id", "user456")])
            .unwrap();
    assert_eq!(
        (post.limit.requests_per_unit, post.stats_key.as_str()),
        (30, "test-domain.route_api.http_method_POST.subject_id")
    );

    let wildcard = inline(
        "domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: { unit: minute, requests_per_unit: 100 }
",
    )
    .unwrap();
    assert_eq!(
        stats_key(&wildcard, "domain", &[("user", "alice"), ("action", "readfile"), ("resource", "documents")]),
        "domain.user_alice.action_readfile.resource"
    );
    assert_eq!(
        stats_key(&wildcard, "domain", &[("user", "bob"), ("action", "readdata"), ("resource", "database")]),
        "domain.user_bob.action_readdata.resource"
    );

    for (request, key) in [
        ([("route", ""), ("http_method", "GET"), ("subject_id", "123")], "domain.route.http_method_GET.subject_id"),
        ([("route", "draw"), ("http_method", ""), ("subject_id", "123")], "domain.route_draw.http_method.subject_id"),
        ([("route", ""), ("http_method", ""), ("subject_id", "123")], "domain.route.http_method.subject_id"),
    ] {
        assert_eq!(stats_key(&chain, "domain", &request), key);
    }

    // The full key is the stats key, whichever flags.
    for config in [
        CHAIN.to_string(),
        CHAIN.replace("value_to_metric: true", "value_to_metric: false"),
        CHAIN.replace(
            "          - key: subject_id\n",
            "          - key: subject_id\n            detailed_metric: true\n",
        ),
    ] {
        let config = inline(&config.replace("domain: domain", "domain: test-domain")).unwrap();
        let f = find(&config, "test-domain", &[("route", "api"), ("http_method", "GET"), ("subject_id", "user123")])
            .unwrap();
        assert!(f.stats_key.starts_with("test-domain.route"), "{}", f.stats_key);
    }
    let first = inline(&CHAIN.replace("domain: domain", "domain: test-domain")).unwrap();
    assert_eq!(
        stats_key(&first, "test-domain", &[("route", "api"), ("http_method", "GET"), ("subject_id", "user123")]),
        "test-domain.route_api.http_method_GET.subject_id"
    );
}

#[test]
fn share_threshold() {
    let config = load(&["share_threshold.yaml"], false).unwrap();
    let f = |entries: &[(&str, &str)]| find(&config, "test-domain", entries).unwrap_or_else(|| panic!("{entries:?}"));
    let shared = |found: &Found| found.shared.iter().map(|p| p.clone().unwrap_or_default()).collect::<Vec<_>>();
    for file in ["files/a.pdf", "files/b.csv", "files/c.txt"] {
        let found = f(&[("files", file)]);
        assert_eq!(
            (found.limit.requests_per_unit, shared(&found), found.stats_key.as_str()),
            (100, vec!["files/*".to_string()], "test-domain.files_files/*")
        );
    }
    let found = f(&[("route", "api/v1"), ("method", "GET")]);
    assert_eq!((shared(&found)[0].as_str(), found.stats_key.as_str()), ("api/*", "test-domain.route_api/*.method"));
    let found = f(&[("service", "svc/user"), ("endpoint", "get")]);
    assert!(found.limit.detailed_metric);
    assert_eq!(
        (shared(&found)[0].as_str(), found.stats_key.as_str()),
        ("svc/*", "test-domain.service_svc/*.endpoint_get")
    );
    let found = f(&[("nested", "parent"), ("files", "nested/file1.txt")]);
    assert_eq!(
        (found.limit.requests_per_unit, shared(&found)[1].as_str(), found.stats_key.as_str()),
        (200, "nested/*", "test-domain.nested_parent.files_nested/*")
    );
    let found = f(&[("files", "top/file1.txt"), ("files", "nested/file1.txt")]);
    assert_eq!(
        (shared(&found), found.stats_key.as_str()),
        (vec!["top/*".to_string(), "nested/*".to_string()], "test-domain.files_top/*.files_nested/*")
    );
    let found = f(&[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")]);
    assert_eq!(
        (shared(&found)[..2].to_vec(), found.stats_key.as_str()),
        (vec!["path/*".to_string(), String::new()], "test-domain.path_path/*.file_file/*.type")
    );
    let found = f(&[("user", "user/alice"), ("resource", "res/file1"), ("action", "read")]);
    assert_eq!(
        (shared(&found)[..2].to_vec(), found.stats_key.as_str()),
        (vec!["user/*".to_string(), "res/*".to_string()], "test-domain.user_user/*.resource_res/*.action")
    );
    let found = f(&[("file", "test1")]);
    assert_eq!(
        (found.limit.requests_per_unit, found.shared.is_empty(), found.stats_key.as_str()),
        (50, true, "test-domain.file_test1")
    );
    for value in ["test2", "test23", "test123"] {
        let found = f(&[("file", value)]);
        assert_eq!(
            (found.limit.requests_per_unit, shared(&found), found.stats_key.as_str()),
            (100, vec!["test*".to_string()], "test-domain.file_test*")
        );
    }
    for value in ["/api/v1", "/api-beta-v1", "/apiXYZv1"] {
        let found = f(&[("midpath", value)]);
        assert_eq!(
            (shared(&found), found.stats_key.as_str()),
            (vec!["/api*v1".to_string()], "test-domain.midpath_/api*v1")
        );
    }
    assert!(find(&config, "test-domain", &[("midpath", "/api/v2")]).is_none());
    for value in ["svcAepBrpc", "svcXXXepYYYrpc", "svceprpc"] {
        let found = f(&[("multiroute", value)]);
        assert_eq!(
            (shared(&found), found.stats_key.as_str()),
            (vec!["svc*ep*rpc".to_string()], "test-domain.multiroute_svc*ep*rpc")
        );
    }
    assert!(find(&config, "test-domain", &[("multiroute", "svcABCrpc")]).is_none());
    for value in ["/api/v2", "/api-beta-v2"] {
        let found = f(&[("midroute", value)]);
        assert_eq!(
            (shared(&found), found.stats_key.as_str()),
            (vec!["/api*v2".to_string()], "test-domain.midroute_/api*v2")
        );
    }
    for request in [[("tenant", "t1prod"), ("resource", "resAv2")], [("tenant", "t99prod"), ("resource", "resBBBv2")]] {
        let found = f(&request);
        assert_eq!(
            (shared(&found), found.stats_key.as_str()),
            (vec!["t*prod".to_string(), "res*v2".to_string()], "test-domain.tenant_t*prod.resource_res*v2")
        );
    }
}

#[test]
fn wildcard_stats_behaviour() {
    let with = |flags: &str| {
        inline(&format!("domain: test-domain\ndescriptors:\n  - key: wild\n    value: foo*\n{flags}    rate_limit: {{ unit: minute, requests_per_unit: 20 }}\n")).unwrap()
    };
    assert_eq!(stats_key(&with(""), "test-domain", &[("wild", "foo1")]), "test-domain.wild_foo*");
    assert_eq!(
        stats_key(&with("    value_to_metric: true\n"), "test-domain", &[("wild", "foo1")]),
        "test-domain.wild_foo1"
    );
    assert_eq!(
        stats_key(&with("    share_threshold: true\n"), "test-domain", &[("wild", "foo1")]),
        "test-domain.wild_foo*"
    );
    assert_eq!(
        stats_key(&with("    share_threshold: true\n    value_to_metric: true\n"), "test-domain", &[("wild", "foo1")]),
        "test-domain.wild_foo*"
    );
    let nested = inline("domain: test-domain\ndescriptors:\n  - key: wild\n    value: foo*\n    descriptors:\n      - key: other\n        value_to_metric: true\n        descriptors:\n          - key: limit\n            rate_limit: { unit: minute, requests_per_unit: 20 }\n").unwrap();
    assert_eq!(
        stats_key(&nested, "test-domain", &[("wild", "foo1"), ("other", "bar"), ("limit", "X")]),
        "test-domain.wild_foo*.other_bar.limit"
    );
    let two = |flags: &str| {
        inline(&format!("domain: test-domain\ndescriptors:\n  - key: wild\n    value: foo*bar*\n{flags}    rate_limit: {{ unit: minute, requests_per_unit: 20 }}\n")).unwrap()
    };
    assert_eq!(stats_key(&two(""), "test-domain", &[("wild", "foo123bar456")]), "test-domain.wild_foo*bar*");
    assert_eq!(stats_key(&two(""), "test-domain", &[("wild", "fooXbarY")]), "test-domain.wild_foo*bar*");
    assert_eq!(
        stats_key(&two("    value_to_metric: true\n"), "test-domain", &[("wild", "foo123bar456")]),
        "test-domain.wild_foo123bar456"
    );
}

#[test]
fn metadata_loads() {
    let config = load(&["metadata.yaml"], false).unwrap();
    assert_eq!(config.lookup("test-domain", &[], None), Lookup::NoLimit);
    assert_eq!(
        limit_of(&config, &[("key1", "value1"), ("subkey1", "something")]).unwrap().3,
        "test-domain.key1_value1.subkey1"
    );
    assert_eq!(limit_of(&config, &[("key2", "something")]).unwrap().3, "test-domain.key2");
}

#[test]
fn a_directory_of_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("more")).unwrap();
    std::fs::create_dir(dir.path().join("..data")).unwrap();
    std::fs::write(dir.path().join("a.yaml"), fixture("merge_domain_key1.yaml").replace("test-domain", "a")).unwrap();
    std::fs::write(dir.path().join("more/b.yml"), fixture("merge_domain_key2.yaml").replace("test-domain", "b"))
        .unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not yaml: [").unwrap();
    std::fs::write(dir.path().join(".hidden.yaml"), "not yaml: [").unwrap();
    std::fs::write(dir.path().join("..data/c.yaml"), "not yaml: [").unwrap();
    let config = RlsConfig::load(dir.path(), false).unwrap();
    assert_eq!(config.files, ["a.yaml", "more/b.yml"]);
    assert!(find(&config, "a", &[("key1", "value1")]).is_some() && find(&config, "b", &[("key2", "value2")]).is_some());
    std::fs::write(dir.path().join("more/b.yml"), fixture("bad_limit_unit.yaml")).unwrap();
    assert_eq!(
        RlsConfig::load(dir.path(), false).unwrap_err().to_string(),
        "more/b.yml:6: descriptors[0].rate_limit.unit: invalid rate limit unit 'foo'"
    );
}
