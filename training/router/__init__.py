"""The difficulty router's training: checkable tasks, both tiers' answers, labels, the
examples file (router_policies/difficulty_examples.jsonl), and the CV that chose its knobs."""
