//! Broker core data structures.
//!
//! The hot-path indexes live here: [`topic_tree::TopicTree`] maps topic filters to subscribers
//! (one lookup per PUBLISH), and [`retained::RetainedIndex`] maps topic names to retained
//! messages (one walk per SUBSCRIBE). Both follow the matching rules of MQTT §4.7 and assume
//! their inputs were already validated by [`crate::codec::topic`].

mod level_map;
pub mod retained;
pub mod topic_tree;

#[cfg(test)]
mod tests;
