/* What rdmactor's build script hands to bindgen: the system's own rdma-core headers. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
