/* Link-time stand-in for libfabric.so.1: gives the linker fi_version and the soname only. */
unsigned int fi_version(void)
{
	return 0;
}
