#include <Python.h>

/* Does not compile: the failing build the tests expect. */
int fixture_broken(void) { return this_symbol_does_not_exist + ; }
