"""The local dev cluster (``gazette dev up``, ``make demo``): etcd, brokers and a consumer
member on one machine, walked through the tutorial. It sits above both services (it
runs brokers and a consumer member), so neither imports the other.

- `gazette_dev.cli`: the installed ``gazette`` command: the broker's ``gazette serve``
  (`gazette_broker.cli`) and ``gazette dev up``;
- `gazette_dev.up`: ``dev up`` itself: ports checked, etcd and brokers started, the
  walk-through run, serving until a signal;
- `gazette_dev.walkthrough`: the tutorial's steps; `gazette_dev.word_count`: the
  consumer's step; `gazette_dev.stopper`: how it stops on signals.
"""
