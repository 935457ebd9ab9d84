"""The pieces that stream data larger than RAM one block of rows at a time, shared by ``outofcore`` (``chunks``,
``map``) and ``dask``: the pure rules of block sizes, pages and release fronts (``rules``), a source read as a
``.npy`` file or an array (``sources``), a block's pages fetched ahead and dropped behind (``pages``), blocks run
in order or on threads with their results checked (``runner``), and the progress bar (``progress``).

They know files, pages and rows, not the machine's memory: the callers choose the rows.

May import: system, adapters.
"""
