"""A run's records, between the replay that writes them and the results that read them: `RequestRecord` and the records
file's Arrow layout, read back (record.py), with the kinds of a request's errors (kinds.py); the crash-safe streaming
writer (writer.py) over Arrow IPC files and streams (ipc_files.py); a run folder's file names (run_folder.py).
"""
