//! Fencing epochs: exact integers from 1 to [`MAX_EPOCH`], end to end.
//!
//! Redis scripts run Lua 5.1, whose numbers are doubles: two epochs above
//! 2^53 can compare equal there, and an epoch stored as `1e300` compares
//! above every integer. So epochs never become numbers in a script: they
//! are checked and compared as decimal strings ([`LUA`]), and in Rust as
//! `u64` parsed digit by digit ([`parse_stored`]).
//!
//! The ceiling is `i64::MAX`, the largest integer Redis itself stores as
//! one: a picked epoch moves up by 2^20 per balancer start, so it is never
//! reached by restarts; only an epoch given by hand can reach it, and then
//! `--take-over` starts over from the bottom. The ceiling and the parse
//! are the share table's ([`rl_gateway::global::store`]): gateways read
//! the same fields.

#[cfg(doc)]
use rl_gateway::global::store::parse_stored;
use rl_gateway::global::store::MAX_EPOCH;

/// Random low bits of a picked epoch, so two balancers started together
/// pick different ones.
const LOW_BITS: u32 = 20;

/// The epoch a new balancer picks above `highest`: the next multiple of
/// 2^20 with random low bits. `None`: no room left below the ceiling.
pub fn next_above(highest: u64) -> Option<u64> {
    // Bits shifted out at the top leave a base at or below `highest`.
    let base = ((highest >> LOW_BITS) + 1) << LOW_BITS;
    let epoch = base | fastrand::u64(..1 << LOW_BITS);
    (base > highest && epoch <= MAX_EPOCH).then_some(epoch)
}

/// An epoch from the bottom, for `--take-over` when none is left above.
pub fn from_the_bottom() -> u64 {
    next_above(0).expect("the bottom is below the ceiling")
}

/// Lua helpers for the share table's scripts: `stored_ok(s)` is
/// [`parse_stored`]'s rule, `below(a, b)` compares two such strings exactly.
pub const LUA: &str = r"
local MAX = '9223372036854775807'
local function below(a, b)
  if #a ~= #b then return #a < #b end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return false
end
local function stored_ok(s)
  if s ~= '0' and not string.find(s, '^[1-9][0-9]*$') then return false end
  return #s < #MAX or (#s == #MAX and not below(MAX, s))
end
";

#[cfg(test)]
mod tests {
    use super::*;
    use rl_gateway::global::store::{parse_stored, Problem};

    #[test]
    fn stored_integers_are_digits_up_to_the_ceiling() {
        assert_eq!(parse_stored("0"), Ok(0));
        assert_eq!(parse_stored("9007199254740993"), Ok(9_007_199_254_740_993));
        assert_eq!(parse_stored("9223372036854775807"), Ok(MAX_EPOCH));
        for above in ["9223372036854775808", "18446744073709551615", "99999999999999999999999"] {
            assert_eq!(parse_stored(above), Err(Problem::AboveCeiling), "{above}");
        }
        for bad in ["", "abc", "1e300", "-1", "+1", " 5", "5 ", "1.0", "007", "0x10"] {
            assert_eq!(parse_stored(bad), Err(Problem::NotAnInteger), "{bad:?}");
        }
        assert!(Problem::AboveCeiling.to_string().contains("9223372036854775807"));
    }

    #[test]
    fn a_picked_epoch_is_above_the_highest_and_below_the_ceiling() {
        for highest in [0, 1, (1 << 20) - 1, 1 << 20, 9_007_199_254_740_993, MAX_EPOCH - (1 << 21)] {
            let e = next_above(highest).unwrap();
            assert!(e > highest && e <= MAX_EPOCH, "{highest} -> {e}");
        }
        assert_eq!(next_above(MAX_EPOCH), None);
        assert_eq!(next_above(MAX_EPOCH - 5), None, "the last block is the one in force");
        assert_eq!(next_above(u64::MAX), None);
        assert!(from_the_bottom() < 1 << 21);
    }
}
