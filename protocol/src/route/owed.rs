//! Stage 4, popular prefixes owed holders: a prefix whose share of the recent traffic would
//! fill more engines than hold it counts as held by every engine, so that the engine the
//! score likes best for its next request takes it, holder or not, and becomes one (see
//! [`super::PrefixTraffic`]).

use super::considered::Considered;
use super::popularity::PrefixShare;

/// A popular prefix owed more holders, and the credit every engine gets for it.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Owed {
    /// The prefix's counted depth, in blocks; 0: no prefix is owed holders.
    pub blocks: u32,
    /// The blocks the score credits every engine with: what its holders hold of the chain,
    /// up to where a longer prefix is no longer known to be as popular.
    pub everywhere: u32,
}

/// The longest popular prefix held by fewer engines than its share of the traffic fills
/// (`⌊share × candidates⌋`), if any (else the default: nothing owed).
pub(super) fn owed(entries: &[Considered], popular: &[PrefixShare]) -> Owed {
    popular
        .iter()
        .rev()
        .find_map(|prefix| {
            // One holder is what any prefix gets: only a share over two engines' is owed more.
            let owed = (prefix.share * entries.len() as f64).floor() as usize;
            if owed < 2 {
                return None;
            }
            let holders = entries.iter().filter(|e| e.matched >= prefix.blocks);
            let (count, held) = holders.fold((0, 0), |(n, most), e| (n + 1, most.max(e.matched)));
            (count < owed).then(|| Owed {
                blocks: prefix.blocks,
                everywhere: held.min(prefix.until).max(prefix.blocks),
            })
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding(matched: &[u32]) -> Vec<Considered> {
        let blank = |(key, &matched)| Considered {
            matched,
            ..Considered::blank(key as u64)
        };
        matched.iter().enumerate().map(blank).collect()
    }

    fn share(blocks: u32, share: f64, until: u32) -> PrefixShare {
        PrefixShare {
            blocks,
            share,
            until,
        }
    }

    #[test]
    fn a_share_that_fills_fewer_than_two_engines_is_owed_nothing() {
        let entries = holding(&[24, 0, 0, 0]);
        assert_eq!(owed(&entries, &[share(24, 0.49, 30)]), Owed::default());
        assert_eq!(owed(&entries, &[]), Owed::default());
    }

    #[test]
    fn a_prefix_held_by_fewer_than_its_share_is_credited_everywhere() {
        let entries = holding(&[26, 0, 0, 0]);
        let owed = owed(&entries, &[share(24, 0.5, 30)]);
        assert_eq!(owed.blocks, 24);
        assert_eq!(owed.everywhere, 26, "what its holder holds, up to `until`");
        let capped = super::owed(&entries, &[share(24, 0.5, 25)]);
        assert_eq!(capped.everywhere, 25);
    }

    #[test]
    fn enough_holders_owe_nothing_and_the_longest_owed_prefix_counts() {
        let entries = holding(&[24, 24, 8, 0]);
        assert_eq!(owed(&entries, &[share(24, 0.5, 30)]), Owed::default());
        // 8 blocks are held by three of four, a share of 0.9 owes them three: nothing owed;
        // 24 blocks, held by two, are owed three.
        let popular = [share(8, 0.9, 8), share(24, 0.9, 24)];
        assert_eq!(
            owed(&entries, &popular),
            Owed {
                blocks: 24,
                everywhere: 24
            }
        );
        let popular = [share(8, 0.9, 8), share(24, 0.5, 24)];
        assert_eq!(owed(&entries, &popular), Owed::default());
    }
}
