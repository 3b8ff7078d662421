/*
 * Sets up a listen/connect/accept triple on every device and closes it again.
 */

#include "test-common.h"

int main(int argc, char **argv)
{
	int rank, size, ndev;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);

	OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.init(test_logger));
	OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.devices(&ndev));
	printf("Rank %d of %d: %s %s, %d device(s)\n", rank, size, NCCL_PLUGIN_SYMBOL.name,
	       aws_ofi_nccl_version(), ndev);
	for (int dev = 0; dev < ndev; dev++) {
		char handle[NCCL_NET_HANDLE_MAXSIZE];
		void *listen_comm, *send_comm, *recv_comm;
		OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.listen(dev, handle, &listen_comm));
		OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.connect(dev, handle, &send_comm));
		OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.accept(listen_comm, &recv_comm));
		OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.closeSend(send_comm));
		OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.closeRecv(recv_comm));
		OFINCCLCHECK(NCCL_PLUGIN_SYMBOL.closeListen(listen_comm));
	}
	printf("Test completed successfully for rank %d\n", rank);
	MPI_Finalize();
	return 0;
}
