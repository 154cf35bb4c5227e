//! The tour of docs/commands.md, replayed: every command of its redis-cli block runs
//! on a fresh server, in order, and every reply it shows is checked. A value
//! whose comment says "about" may differ by 5% (it depends on the time the
//! reader takes), "varies" is not compared, and "..." skips the rest.

use testkit::Server;

/// One reply item as the tour shows it.
enum Want {
    Int(i64, Match),
    Text(String),
}

#[derive(PartialEq)]
enum Match {
    Exact,
    About,
    Any,
}

/// The commands of the tour and the reply items shown after each.
fn tour() -> Vec<(usize, Vec<String>, Vec<Want>)> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/commands.md")).unwrap();
    let start = readme.find("## A tour with redis-cli").expect("the tour section");
    let block = &readme[start..];
    let block = &block[block.find("```text").unwrap() + 7..];
    let block = &block[..block.find("```").unwrap()];
    let mut steps: Vec<(usize, Vec<String>, Vec<Want>)> = Vec::new();
    for line in block.lines() {
        if let Some(cmd) = line.strip_prefix("127.0.0.1:6379> ") {
            let mut words: Vec<String> = cmd.split_whitespace().map(String::from).collect();
            let repeat = words[0].parse().ok().inspect(|_| {
                words.remove(0);
            });
            steps.push((repeat.unwrap_or(1), words, Vec::new()));
            continue;
        }
        let Some((_, _, wants)) = steps.last_mut() else { continue };
        let (item, comment) = line.split_once('#').unwrap_or((line, ""));
        let item = item.trim();
        if item.is_empty() || item.starts_with('$') {
            continue;
        }
        if item == "..." {
            wants.push(Want::Text("...".into()));
            continue;
        }
        // "1) (integer) 5", "(integer) 5", "6) \"req-7\"", "rl-bucket"
        let item = item.split_once(") ").filter(|(n, _)| n.trim().parse::<u32>().is_ok()).map_or(item, |(_, v)| v);
        let matching = if comment.contains("varies") {
            Match::Any
        } else if comment.contains("about") {
            Match::About
        } else {
            Match::Exact
        };
        wants.push(match item.strip_prefix("(integer) ") {
            Some(n) => Want::Int(n.trim().parse().unwrap(), matching),
            None => Want::Text(item.trim_matches('"').to_string()),
        });
    }
    steps
}

/// A reply as the items redis-cli prints, in order.
fn items(v: redis::Value) -> Vec<Result<i64, String>> {
    match v {
        redis::Value::Int(i) => vec![Ok(i)],
        redis::Value::Array(a) => a.into_iter().flat_map(items).collect(),
        redis::Value::Okay => vec![Err("OK".into())],
        other => vec![Err(redis::from_redis_value::<String>(other).unwrap_or_default())],
    }
}

#[test]
fn the_readme_tour_answers_as_shown() {
    let s = Server::start(&[]);
    let mut con = s.con();
    let steps = tour();
    assert!(steps.len() >= 17, "the tour has {} commands: was it found?", steps.len());
    let mut checked = 0;
    for (repeat, words, wants) in steps {
        let shown = words.join(" ");
        let mut reply = redis::Value::Nil;
        for _ in 0..repeat {
            reply = redis::cmd(&words[0]).arg(&words[1..]).query(&mut con).unwrap_or_else(|e| panic!("{shown}: {e}"));
        }
        let got = items(reply);
        for (i, want) in wants.iter().enumerate() {
            match (want, got.get(i)) {
                (Want::Text(t), _) if t == "..." => break,
                (Want::Int(n, Match::Exact), Some(Ok(g))) => assert_eq!(g, n, "{shown}: item {}", i + 1),
                (Want::Int(n, Match::About), Some(Ok(g))) => {
                    assert!((g - n).abs() <= (n.abs() / 20).max(2), "{shown}: item {} is {g}, about {n}", i + 1)
                }
                (Want::Int(_, Match::Any), Some(Ok(_))) => {}
                (Want::Text(t), Some(Err(g))) => assert_eq!(g, t, "{shown}: item {}", i + 1),
                (_, g) => panic!("{shown}: item {} is {g:?}", i + 1),
            }
            checked += 1;
        }
    }
    assert!(checked >= 70, "only {checked} reply items checked");
}
