"""What is made of a snapshot before it is shown: symbols, growth, per-process rows."""
