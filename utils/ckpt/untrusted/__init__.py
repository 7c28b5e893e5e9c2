"""Loading untrusted bytes: pickles, torch zips and DCP indexes from a checkpoint someone else wrote. Its one door
is `safe_load`; the rest (`pickle_walk`, `bounded`, `index_check`, `stoppable`) is what safe_load checks with."""
