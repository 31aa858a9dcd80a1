"""Graph IR passes, one per module: each a function from Graph to Graph."""
