//! Parsers: the inverse of the builders in [`super`].

use super::{
    Channel, SubjectError, TaskChannel, TaskKey, ATTACH_PREFIX, BROADCAST_PREFIX,
    INBOX_CONSUMER_PREFIX, INBOX_PREFIX, INBOX_TOKEN, INGRESS_PREFIX, ROUTER_MSG_ID_PREFIX,
    TASK_PREFIX, TASK_TOKEN,
};
use crate::ids::{AgentId, ChannelName, IdError, MessageId};

/// Token counts after `hub.pub.`: `<id>.inbox`, `<id>.<name>` or `<id>.task.<delegator>.<key>`.
const INGRESS_TOKENS: &str = "2 or 4";

/// Parses an ingress subject into the sender identity and the channel.
///
/// # Errors
///
/// Returns a [`SubjectError`] if `subject` is not
/// `hub.pub.<id>.inbox`, `hub.pub.<id>.task.<delegator>.<key>` or `hub.pub.<id>.<name>`
/// with valid tokens.
pub fn parse_ingress(subject: &str) -> Result<(AgentId, Channel), SubjectError> {
    let rest = strip(subject, INGRESS_PREFIX)?;
    let (id, channel) = rest
        .split_once('.')
        .ok_or_else(|| token_count(subject, INGRESS_TOKENS, 1))?;
    let from = token(subject, AgentId::new(id))?;
    // A DM's (the most common) without splitting the rest.
    if channel == INBOX_TOKEN {
        return Ok((from, Channel::Inbox));
    }
    let tokens: Vec<&str> = channel.split('.').collect();
    let channel = match tokens.as_slice() {
        [INBOX_TOKEN] => Channel::Inbox,
        [name] => Channel::Broadcast(token(subject, ChannelName::new(*name))?),
        [TASK_TOKEN, delegator, key] => Channel::Task(TaskChannel {
            delegator: token(subject, AgentId::new(*delegator))?,
            key: token(subject, TaskKey::new(*key))?,
        }),
        [found, _, _] => return Err(unexpected(subject, TASK_TOKEN, found)),
        _ => return Err(token_count(subject, INGRESS_TOKENS, tokens.len() + 1)),
    };
    Ok((from, channel))
}

/// Whether `subject` is a well-formed ingress subject.
pub fn is_ingress_subject(subject: &str) -> bool {
    parse_ingress(subject).is_ok()
}

/// Parses `channel.inbox.<id>`.
///
/// # Errors
///
/// Returns a [`SubjectError`] if `subject` is not an inbox subject with a
/// valid identity.
pub fn parse_inbox(subject: &str) -> Result<AgentId, SubjectError> {
    let id = single_token(subject, INBOX_PREFIX)?;
    token(subject, AgentId::new(id))
}

/// Parses `channel.task.<delegator>.<key>`.
///
/// # Errors
///
/// Returns a [`SubjectError`] if `subject` is not a task subject with a
/// valid delegator and key.
pub fn parse_task(subject: &str) -> Result<TaskChannel, SubjectError> {
    let rest = strip(subject, TASK_PREFIX)?;
    let tokens: Vec<&str> = rest.split('.').collect();
    match tokens.as_slice() {
        [delegator, key] => Ok(TaskChannel {
            delegator: token(subject, AgentId::new(*delegator))?,
            key: token(subject, TaskKey::new(*key))?,
        }),
        _ => Err(token_count(subject, "2", tokens.len())),
    }
}

/// Parses `hub.delivery.<id>.task` ([`super::task_read_request`]).
///
/// # Errors
///
/// Returns a [`SubjectError`] if `subject` is not a task read request with a valid identity.
pub fn parse_task_read_request(subject: &str) -> Result<AgentId, SubjectError> {
    let rest = strip(subject, ATTACH_PREFIX)?;
    let tokens: Vec<&str> = rest.split('.').collect();
    match tokens.as_slice() {
        [id, TASK_TOKEN] => token(subject, AgentId::new(*id)),
        [_, found] => Err(unexpected(subject, TASK_TOKEN, found)),
        _ => Err(token_count(subject, "2", tokens.len())),
    }
}

/// Parses `channel.<name>`.
///
/// # Errors
///
/// Returns a [`SubjectError`] if `subject` is not a broadcast subject with
/// a valid, non-reserved channel name (`channel.inbox.<id>` and
/// `channel.task.<delegator>.<key>` are rejected).
pub fn parse_broadcast(subject: &str) -> Result<ChannelName, SubjectError> {
    let name = single_token(subject, BROADCAST_PREFIX)?;
    token(subject, ChannelName::new(name))
}

/// Parses `hub.delivery.<id>.inbox`.
///
/// # Errors
///
/// Returns a [`SubjectError`] if `subject` is not an attach request subject
/// with a valid identity.
pub fn parse_attach_request(subject: &str) -> Result<AgentId, SubjectError> {
    let rest = strip(subject, ATTACH_PREFIX)?;
    let tokens: Vec<&str> = rest.split('.').collect();
    match tokens.as_slice() {
        [id, INBOX_TOKEN] => token(subject, AgentId::new(*id)),
        [_, found] => Err(unexpected(subject, INBOX_TOKEN, found)),
        _ => Err(token_count(subject, "2", tokens.len())),
    }
}

/// Parses the inbox consumer name `inbox-<id>`.
///
/// # Errors
///
/// Returns a [`SubjectError`] if `name` does not start with `inbox-` or the
/// rest is not a valid identity.
pub fn parse_inbox_consumer(name: &str) -> Result<AgentId, SubjectError> {
    let id = strip(name, INBOX_CONSUMER_PREFIX)?;
    token(name, AgentId::new(id))
}

/// Parses a router message id `hub-router:<from>:<id>`.
///
/// # Errors
///
/// Returns a [`SubjectError`] if `msg_id` does not start with
/// [`ROUTER_MSG_ID_PREFIX`] or its identity or message id is invalid.
pub fn parse_router_msg_id(msg_id: &str) -> Result<(AgentId, MessageId), SubjectError> {
    let rest = strip(msg_id, ROUTER_MSG_ID_PREFIX)?;
    // An agent id never contains `:`, so the first one ends it.
    let (from, id) = rest.split_once(':').unwrap_or((rest, ""));
    let from = token(msg_id, AgentId::new(from))?;
    let id = token(msg_id, MessageId::new(id))?;
    Ok((from, id))
}

pub(super) fn strip<'a>(subject: &'a str, prefix: &'static str) -> Result<&'a str, SubjectError> {
    subject
        .strip_prefix(prefix)
        .ok_or_else(|| SubjectError::WrongPrefix {
            expected: prefix,
            subject: subject.to_owned(),
        })
}

fn single_token<'a>(subject: &'a str, prefix: &'static str) -> Result<&'a str, SubjectError> {
    let rest = strip(subject, prefix)?;
    match rest.split('.').count() {
        1 => Ok(rest),
        found => Err(token_count(subject, "1", found)),
    }
}

pub(super) fn token<T>(subject: &str, parsed: Result<T, IdError>) -> Result<T, SubjectError> {
    parsed.map_err(|source| SubjectError::InvalidToken {
        subject: subject.to_owned(),
        source,
    })
}

pub(super) fn unexpected(subject: &str, expected: &'static str, found: &str) -> SubjectError {
    SubjectError::UnexpectedToken {
        subject: subject.to_owned(),
        expected,
        found: found.to_owned(),
    }
}

pub(super) fn token_count(subject: &str, expected: &'static str, found: usize) -> SubjectError {
    SubjectError::WrongTokenCount {
        subject: subject.to_owned(),
        expected,
        found,
    }
}
