//! `distlock watch`: looks at the locks at every interval and tells what changed since the last
//! look — acquired, handed over, released, expired. In a terminal the table is redrawn in place
//! with the latest changes under it; otherwise each change is one line, for logs and pipes.
//!
//! Changes are inferred from two looks: a lock taken and released between them is not seen.

use std::collections::{BTreeMap, VecDeque};
use std::io::{IsTerminal, Write};
use std::time::{Duration, SystemTime};

use distlock::{LockInfo, LockManager};

use crate::format;
use crate::Failure;

/// How many changes the terminal view keeps under the table.
const RECENT: usize = 15;

pub(crate) async fn run(
    manager: &LockManager,
    pattern: &str,
    interval: Duration,
    looks: Option<u64>,
) -> Result<(), Failure> {
    let terminal = std::io::stdout().is_terminal();
    let mut previous: Option<(BTreeMap<String, LockInfo>, tokio::time::Instant)> = None;
    let mut recent: VecDeque<String> = VecDeque::new();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut looked = 0;
    while looks.is_none_or(|looks| looked < looks) {
        ticker.tick().await;
        looked += 1;
        let now = tokio::time::Instant::now();
        let locks: BTreeMap<String, LockInfo> = crate::collect(manager, pattern)
            .await?
            .into_iter()
            .map(|info| (info.name.clone(), info))
            .collect();
        let changes = match &previous {
            // The first look: every lock is news only in the terminal's table.
            None if terminal => Vec::new(),
            None => locks.values().map(held_line).collect(),
            // From the start of the last look to the end of this one: a lock whose ttl had
            // run out by then may have expired rather than been released.
            Some((before, at)) => changes(before, &locks, at.elapsed()),
        };
        let stamp = format::clock(SystemTime::now());
        let mut out = std::io::stdout().lock();
        let written = if terminal {
            for change in changes {
                recent.push_back(format!("{stamp}  {change}"));
                if recent.len() > RECENT {
                    recent.pop_front();
                }
            }
            let infos: Vec<LockInfo> = locks.values().cloned().collect();
            let table = if infos.is_empty() {
                format!("no held lock matches {pattern:?}\n")
            } else {
                format::table(&infos)
            };
            let mut screen = format!(
                "\x1b[H\x1b[2J{stamp}  {} lock(s) matching {pattern:?}, every {}\n\n{table}\n",
                infos.len(),
                format::duration(interval)
            );
            for change in &recent {
                screen.push_str(change);
                screen.push('\n');
            }
            out.write_all(screen.as_bytes())
        } else {
            changes
                .iter()
                .try_for_each(|change| writeln!(out, "{stamp}  {change}"))
        };
        if let Err(error) = written.and_then(|()| out.flush()) {
            // A closed pipe (`distlock watch | head`) ends the watch; that is no error.
            if error.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(Failure::Error(format!(
                "cannot write to standard output: {error}"
            )));
        }
        previous = Some((locks, now));
    }
    Ok(())
}

fn held_line(info: &LockInfo) -> String {
    format!(
        "held        {} by {}",
        format::cell(&info.key),
        format::whose(info)
    )
}

/// Who holds a lock, every holder by what names it (not by its lease left, which changes with
/// every look).
fn who(info: &LockInfo) -> Vec<(&str, u32, &str, std::time::SystemTime)> {
    info.holders
        .iter()
        .map(|holder| {
            (
                holder.host.as_str(),
                holder.pid,
                holder.label.as_str(),
                holder.since,
            )
        })
        .collect()
}

/// What changed between two looks, the earlier one started `elapsed` ago.
fn changes(
    before: &BTreeMap<String, LockInfo>,
    now: &BTreeMap<String, LockInfo>,
    elapsed: Duration,
) -> Vec<String> {
    let mut changes = Vec::new();
    for (name, info) in now {
        match before.get(name) {
            None => changes.push(format!(
                "acquired    {} by {}",
                format::cell(&info.key),
                format::whose(info)
            )),
            Some(old) if who(old) != who(info) => changes.push(format!(
                "handed over {} from {} to {}",
                format::cell(&info.key),
                format::whose(old),
                format::whose(info)
            )),
            Some(_) => {}
        }
    }
    for (name, old) in before {
        if now.contains_key(name) {
            continue;
        }
        // Gone once its ttl could have run out: it expired; gone earlier: it was released.
        let expired = old.ttl_left.is_some_and(|left| left <= elapsed);
        let what = if expired {
            "expired     "
        } else {
            "released    "
        };
        changes.push(format!(
            "{what}{} (held by {})",
            format::cell(&old.key),
            format::whose(old)
        ));
    }
    changes
}
