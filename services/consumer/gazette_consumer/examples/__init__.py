"""Example consumer applications, each runnable with ``gazette-consumer serve --app``:

- `stream_sum`: Gazette's stream-sum. Chunks of many streams are summed per stream,
  exactly once, and each stream's sum is published when its last chunk is read; its
  driver publishes chunks (in transactions, rolled back, re-sent) and checks every sum.
- `word_count`: counts of the words of text messages.
"""
